"""Writing one run's figures into bench/README.md and the project README."""

from __future__ import annotations

BEGIN = "<!-- bench-report:begin -->"
END = "<!-- bench-report:end -->"
SUMMARY_BEGIN = "<!-- bench-targets:begin -->"
SUMMARY_END = "<!-- bench-targets:end -->"


def update_summary(path: str, summary: str) -> None:
    """Replace the targets table between the markers in the project README."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(SUMMARY_BEGIN), text.find(SUMMARY_END)
    if start < 0 or end < start:
        return
    new = text[: start + len(SUMMARY_BEGIN)] + "\n" + summary + text[end:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)


def update_readme(path: str, markdown: str) -> None:
    """Replace the figures between the markers in bench/README.md."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return
    body = markdown.split("\n", 1)[1].lstrip("\n")  # drop the report's own title
    body = body.replace("\n## ", "\n### ")
    if body.startswith("## "):
        body = "#" + body
    new = (
        text[: start + len(BEGIN)]
        + "\n"
        + body
        + "\n![latency distributions](latency.png)\n"
        + text[end:]
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
