"""The ``dynamo`` layer: Dynamo's precompile packages, their stored form and their serving rule."""
