"""The paper-vs-ours tables as files a researcher pastes: CSV, LaTeX (booktabs) and Markdown.

They render the comparisons of ``page.paper_comparisons``, the one owner of the table data, which
the report page renders too: the same rows, columns and numbers. A cell reads "ours (the paper's)":
our mean ± std over seeds, then the paper's value (± its std where it gives one); the best number
of ours and the best of the paper's in each group the paper compares (``best_among``) in bold.
CSV has one line per cell with every number at full precision.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

FORMATS = {"csv": "csv", "latex": "tex", "md": "md"}  # --format -> file suffix
CSV_FIELDS = [
    "table",
    "row",
    "column",
    "ours",
    "ours_std",
    "seeds",
    "paper",
    "paper_std",
    "delta",
    "allowed",
    "within",
    "interval",
    "consistent",
    "verdict",
    "collapsed",
    "diverged",
    "in_scope",
    "best_ours",
    "best_paper",
]
NOTE = (
    "Ours: mean ± std over seeds; in parentheses the paper's value (± its std); the best in bold; "
    "— not run (or outside this params file)."
)


def number(value) -> str:
    """A number as the report page prints it (two decimals); none (or NaN) is an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float) and math.isinf(value):
        return "never"  # rounds to a target the run never reached
    return f"{value:.2f}"


# ---------------------------------------------------------------------------------------------- CSV


def to_csv(comparisons: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for comparison in comparisons:
        for row in comparison["rows"]:
            for column, cell in zip(comparison["columns"], row["cells"]):
                writer.writerow(
                    {
                        "table": comparison["name"],
                        "row": row["label"],
                        "column": column,
                        **{k: _csv_value(cell.get(k)) for k in CSV_FIELDS[3:]},
                    }
                )
    return buffer.getvalue()


def _csv_value(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(float(value)) if isinstance(value, float) else value


# ---------------------------------------------------------------------------------- LaTeX, Markdown

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
# the non-ASCII characters of the papers' labels, in plain LaTeX (no package beyond booktabs)
_LATEX_UNICODE = {
    "±": r"$\pm$",
    "×": r"$\times$",
    "α": r"$\alpha$",
    "β": r"$\beta$",
    "γ": r"$\gamma$",
    "λ": r"$\lambda$",
    "η": r"$\eta$",
    "μ": r"$\mu$",
    "σ": r"$\sigma$",
    "τ": r"$\tau$",
    "Δ": r"$\Delta$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "−": "-",
    "–": "--",
    "—": "---",
    "·": r"$\cdot$",
    "→": r"$\to$",
    "∞": r"$\infty$",
}


def latex_text(text: str) -> str:
    """Plain text as LaTeX: its special characters escaped, the labels' Greek letters and signs in math."""
    out = []
    for ch in str(text):
        if ch in _LATEX_SPECIAL:
            out.append(_LATEX_SPECIAL[ch])
        elif ch in _LATEX_UNICODE:
            out.append(_LATEX_UNICODE[ch])
        elif ord(ch) > 127:
            out.append("?")  # not set up for pdflatex: say so, rather than fail the document
        else:
            out.append(ch)
    return "".join(out)


def _mean_std(mean, std, bold: bool, latex: bool) -> str:
    text = number(mean) if std is None else f"{number(mean)} ± {number(std)}"
    if latex:
        text = text.replace(" ± ", r" \pm ")
        return rf"$\mathbf{{{text}}}$" if bold else f"${text}$"
    return f"**{text}**" if bold else text


def cell_text(cell: dict, latex: bool) -> str:
    """ "ours (paper)" as the exports print a cell."""
    if cell.get("ours") is not None:
        ours = _mean_std(cell["ours"], cell.get("ours_std"), cell.get("best_ours", False), latex)
    elif cell.get("diverged"):
        ours = "diverged"
    else:
        ours = "--" if latex else "—"
    if cell.get("paper") is None:
        return ours
    return f"{ours} ({_mean_std(cell['paper'], cell.get('paper_std'), cell.get('best_paper', False), latex)})"


def to_latex(comparison: dict) -> str:
    """One table as a booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    columns = comparison["columns"]
    lines = [
        f"% {comparison['name']}, written by fedrepro (page.paper_comparisons); needs \\usepackage{{booktabs}}",
        r"\begin{table}[ht]",
        r"\centering",
        rf"\caption{{{latex_text(comparison['title'])}. {latex_text(NOTE)}}}",
        rf"\label{{tab:{re.sub(r'[^A-Za-z0-9]+', '-', comparison['name'])}}}",
        rf"\begin{{tabular}}{{l{'c' * len(columns)}}}",
        r"\toprule",
        " & ".join(["", *map(latex_text, columns)]) + r" \\",
        r"\midrule",
    ]
    for row in comparison["rows"]:
        lines.append(" & ".join([latex_text(row["label"]), *(cell_text(c, True) for c in row["cells"])]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", r"\|")


def to_markdown(comparison: dict) -> str:
    columns = comparison["columns"]
    lines = [
        f"### {_md(comparison['title'])}",
        "",
        "| " + " | ".join(["", *map(_md, columns)]) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for row in comparison["rows"]:
        lines.append("| " + " | ".join([_md(row["label"]), *(_md(cell_text(c, False)) for c in row["cells"])]) + " |")
    lines += ["", NOTE]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- output


def render(comparisons: list[dict], fmt: str) -> str:
    """All the tables in one text (``fedrepro tables``): CSV as one file, the others one after another."""
    if fmt == "csv":
        return to_csv(comparisons)
    one = to_latex if fmt == "latex" else to_markdown
    return "\n".join(one(c) for c in comparisons)


def write(comparisons: list[dict], folder: str | Path) -> dict[str, dict[str, str]]:
    """Each table in each format into ``folder`` (``<table>.csv``, ``.tex``, ``.md``); per table the files'
    paths relative to the folder's parent, where the page that links them lives."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    links = {}
    for comparison in comparisons:
        links[comparison["name"]] = {}
        for fmt, suffix in FORMATS.items():
            path = folder / f"{comparison['name']}.{suffix}"
            path.write_text(render([comparison], fmt))
            links[comparison["name"]][fmt] = f"{folder.name}/{path.name}"
    return links
