"""The read-only web dashboard at ``/ui``: static HTML, JS and CSS, no external scripts.

The page itself is public (it holds no data); every number it shows comes from the API with the
bearer token the user types in (kept in the tab's sessionStorage), so it sees exactly what that
token may read. With an open server no token is needed.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from kcache_server.domain_errors import NotFound

router = APIRouter(tags=["dashboard"], include_in_schema=False)

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
_MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# Everything the page loads comes from this origin; the page never runs inline script.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _static(name: str) -> Response:
    path = UI_DIR / name
    # Only plain files directly in the ui dir, by exact name: no traversal, no dotfiles.
    if "/" in name or "\\" in name or name.startswith(".") or path.suffix not in _MEDIA or not path.is_file():
        raise NotFound(f"dashboard file {name}")
    return FileResponse(path, media_type=_MEDIA[path.suffix], headers=_HEADERS)


@router.get("/ui")
def index() -> Response:
    return _static("index.html")


@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    return _static(name)
