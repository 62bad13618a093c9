"""Render a Markdown design note to PDF with markdown-pdf (PyMuPDF; no LaTeX, no browser).

``python docs/render.py docs/design.md docs/design.pdf`` writes the PDF and prints its page
count.  A4, one stylesheet below; a line holding only ``<!-- pagebreak -->`` starts a new page.
``make docs`` installs markdown-pdf into .venv (and Graphviz, if ``dot`` is missing) and runs this.

Figures: every ``diagrams/*.dot`` beside the source is first drawn to ``diagrams/*.png`` with
Graphviz's ``dot`` (again only when the ``.dot`` is newer than its PNG), at ``DIAGRAM_DPI``.  The
Markdown refers to them as ``![caption](diagrams/name.png)``: image paths are relative to the
source's folder, which is the story's archive.  MuPDF takes every PNG as 96 dpi (it ignores the
file's resolution) and scales an image wider than the text down to the text's width: a figure
drawn 7 to 8 inches wide is shown 6.85 inches wide, its 10 pt text at about 9 pt.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pymupdf
from markdown_pdf import MarkdownPdf, Section

CSS = """
body { font-family: sans-serif; font-size: 9pt; line-height: 1.25; }
h1 { font-size: 17pt; margin-bottom: 2pt; }
h2 { font-size: 13pt; margin-top: 10pt; margin-bottom: 3pt; }
h3 { font-size: 10.5pt; margin-top: 7pt; margin-bottom: 2pt; }
p, li { text-align: left; margin-top: 2pt; margin-bottom: 3pt; }
code { font-family: monospace; font-size: 8.5pt; }
pre { font-family: monospace; font-size: 6.9pt; line-height: 1.12; border: 0.5pt solid #bbbbbb;
      padding: 3pt; margin-top: 3pt; margin-bottom: 4pt; }
pre code { font-size: 6.9pt; }
table { border-collapse: collapse; margin-top: 3pt; margin-bottom: 5pt; }
th, td { border: 0.5pt solid #999999; padding: 1pt 2.5pt; font-size: 8pt; vertical-align: top;
         text-align: left; line-height: 1.1; }
th { font-weight: bold; }
td code, th code { font-size: 6.9pt; }
blockquote { margin-left: 8pt; color: #333333; }
img { margin-top: 2pt; margin-bottom: 0pt; }
"""

BREAK = re.compile(r"^<!-- pagebreak -->$", re.MULTILINE)
MARGINS = (42, 40, -42, -40)  # left, top, right, bottom in points
DIAGRAM_DPI = 192  # PNG resolution: sharp when printed, a few hundred kB a figure


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def render_diagrams(folder: Path) -> None:
    """Draw each ``folder/*.dot`` to a PNG beside it, unless that PNG is newer than the source."""
    dot = shutil.which("dot")
    for source in sorted(folder.glob("*.dot")):
        png = source.with_suffix(".png")
        if png.exists() and png.stat().st_mtime >= source.stat().st_mtime:
            continue
        if dot is None:
            raise SystemExit("the figures need Graphviz's dot: apt-get install graphviz")
        command = [dot, "-Tpng", f"-Gdpi={DIAGRAM_DPI}", "-o", str(png), str(source)]
        subprocess.run(command, check=True)


def squeezed_figures(pdf: Path) -> list[int]:
    """Indexes (in document order) of the images MuPDF shrank to fit what was left of a page.

    An image is drawn at its natural size (MuPDF: 96 dpi, whatever the file says) or, if
    wider, at the width of the text; one that did not fit below the text already on its page is
    shrunk to fit instead, keeping its aspect ratio, so it comes out narrower than that.  The
    width of the text is taken as the widest image's: true while one figure is wider than it.
    """
    with pymupdf.open(str(pdf)) as doc:
        images = [info for page in doc for info in page.get_image_info()]
    if not images:
        return []
    column = max(info["bbox"][2] - info["bbox"][0] for info in images)
    return [
        i
        for i, info in enumerate(images)
        if info["bbox"][2] - info["bbox"][0] < min(column, info["width"] * 72 / 96) - 1
    ]


def render(source: Path, target: Path) -> int:
    """Write ``target``; a figure that would not fit on the rest of a page starts a new one."""
    render_diagrams(source.parent / "diagrams")
    text = source.read_text(encoding="utf-8")
    figures = list(IMAGE.finditer(text))
    missing = [m[1] for m in figures if not (source.parent / m[1]).is_file()]
    if missing:  # MuPDF would leave the figure out without a word
        raise SystemExit(f"{source}: no such image: {', '.join(missing)}")
    breaks: set[int] = set()
    while True:
        marked = text
        for i in sorted(breaks, reverse=True):
            line = text.rfind("\n", 0, figures[i].start()) + 1
            marked = marked[:line] + "<!-- pagebreak -->\n\n" + marked[line:]
        pdf = MarkdownPdf(toc_level=2, optimize=True)
        for part in BREAK.split(marked):
            pdf.add_section(Section(part, root=str(source.parent), borders=MARGINS), user_css=CSS)
        pdf.meta["title"] = text.splitlines()[0].lstrip("# ").strip()
        pdf.meta["author"] = "Headwater engineers"
        pdf.save(str(target))
        # one at a time: a break moves every later figure; one taller than a page stays shrunk
        new = [i for i in squeezed_figures(target) if i not in breaks]
        if not new:
            break
        breaks.add(new[0])
    with pymupdf.open(str(target)) as doc:
        return int(doc.page_count)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python docs/render.py SOURCE.md TARGET.pdf", file=sys.stderr)
        return 2
    pages = render(Path(argv[1]), Path(argv[2]))
    print(f"{argv[2]}: {pages} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
