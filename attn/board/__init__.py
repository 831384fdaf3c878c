"""The run board: a page showing every run and experiment under some paths,
live while they train, or exported once as files that open from disk.

    attn board [PATHS ...]                serve it on http://127.0.0.1:8765/ (attn.board.server)
    attn board --static DIR [PATHS ...]   write DIR/index.html with the data embedded (attn.board.export)

What the page shows comes only from run directories, read through the
same readers as `attn compare` (attn.board.data). The page itself is
static/: index.html, board.js (the page), curves.js, hparams.js (the shared colours, the
hyperparameter views), filter.js, markdown.js, board.css, and uPlot 1.6.32 (MIT,
npm package `uplot`, dist/uPlot.iife.min.js and dist/uPlot.min.css as
published; its licence is static/uPlot.LICENSE). Nothing is fetched from
anywhere else at run time.
"""

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
DEFAULT_HOST = "127.0.0.1"  # this machine only; another address only when --host says so
DEFAULT_PORT = 8765  # `attn board` without --port: this port, or any free one if it is taken
