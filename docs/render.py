"""Render a Markdown design note to PDF with markdown-pdf (PyMuPDF; no LaTeX, no browser).

``python docs/render.py docs/design.md docs/design.pdf`` writes the PDF and prints its page
count.  A4, one stylesheet below; a line holding only ``<!-- pagebreak -->`` starts a new page.
``make docs`` installs markdown-pdf into .venv and runs this.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pymupdf
from markdown_pdf import MarkdownPdf, Section

CSS = """
body { font-family: sans-serif; font-size: 9.5pt; line-height: 1.3; }
h1 { font-size: 17pt; margin-bottom: 2pt; }
h2 { font-size: 13pt; margin-top: 10pt; margin-bottom: 3pt; }
h3 { font-size: 10.5pt; margin-top: 7pt; margin-bottom: 2pt; }
p, li { text-align: left; margin-top: 2pt; margin-bottom: 3pt; }
code { font-family: monospace; font-size: 8.5pt; }
pre { font-family: monospace; font-size: 6.9pt; line-height: 1.12; border: 0.5pt solid #bbbbbb;
      padding: 3pt; margin-top: 3pt; margin-bottom: 4pt; }
pre code { font-size: 6.9pt; }
table { border-collapse: collapse; margin-top: 3pt; margin-bottom: 5pt; }
th, td { border: 0.5pt solid #999999; padding: 1.5pt 3pt; font-size: 8pt; vertical-align: top;
         text-align: left; }
th { font-weight: bold; }
td code, th code { font-size: 6.9pt; }
blockquote { margin-left: 8pt; color: #333333; }
"""

BREAK = re.compile(r"^<!-- pagebreak -->$", re.MULTILINE)
MARGINS = (42, 40, -42, -40)  # left, top, right, bottom in points


def render(source: Path, target: Path) -> int:
    text = source.read_text(encoding="utf-8")
    pdf = MarkdownPdf(toc_level=2, optimize=True)
    for part in BREAK.split(text):
        pdf.add_section(Section(part, root=str(source.parent), borders=MARGINS), user_css=CSS)
    pdf.meta["title"] = text.splitlines()[0].lstrip("# ").strip()
    pdf.meta["author"] = "Headwater engineers"
    pdf.save(str(target))
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
