"""``/docs``: Swagger UI for the OpenAPI document, served from the package (no CDN).

FastAPI's own ``/docs`` loads Swagger UI from cdn.jsdelivr.net and its favicon from
fastapi.tiangolo.com: a blank page in an air-gapped cluster. This is FastAPI's recipe for
self-hosted docs assets, with the files vendored in ``kcache_server/swagger_ui`` (see its
README). ``/redoc`` (CDN only too) is switched off.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from kcache_server.domain_errors import NotFound

router = APIRouter(tags=["docs"], include_in_schema=False)

DOCS = "/docs"
ASSETS = f"{DOCS}/static"
SWAGGER_UI_VERSION = "5.35.0"
SWAGGER_UI_DIR = Path(__file__).resolve().parent.parent / "swagger_ui"
_MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png"}


@router.get(DOCS)
def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - API docs",
        swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS}/favicon-32x32.png",
        # Swagger UI would otherwise ask validator.swagger.io about the document.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get(f"{ASSETS}/{{name}}")
def asset(name: str) -> Response:
    path = SWAGGER_UI_DIR / name
    # Only the vendored files, by exact name: no traversal, no dotfiles.
    if "/" in name or "\\" in name or name.startswith(".") or path.suffix not in _MEDIA or not path.is_file():
        raise NotFound(f"docs asset {name}")
    return FileResponse(path, media_type=_MEDIA[path.suffix], headers={"Cache-Control": "public, max-age=86400"})
