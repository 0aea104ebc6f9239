"""The view as rich text: the full screen of `fab watch` and the compact line under `fab train`.

At 80 columns (wider terminals widen the bars):

    tandem watch · run-20261123-021500 · 02:15:07 · every 2 s · Ctrl-C leaves
    host  ranks state    GPU util, memory        NIC Mbit/s ↑tx ↓rx, of link   CPU
    v100a 0     running  no GPU                  ↑  9.1 ↓  9.0 ███████░ 95%     87%

One line per GPU; when the hosts' GPUs would not fit the terminal's height, one line per host
(the mean and the least busy GPU). A NIC bar turns red above 80 % of the link.
"""

from __future__ import annotations

import re
import time

from rich.console import Group
from rich.text import Text

from ..recipe.logformat import format_eta
from .screen import HostRow, Screen

NIC_HOT = 0.80  # a NIC above this share of the link is drawn red
RANKS_W, STATE_W, GPU_W, NIC_W, CPU_W = 5, 8, 23, 28, 4
GPU_BAR, NIC_BAR = 7, 7  # at 80 columns
FIXED_LINES = 8  # title, header, blank, three run lines, up to two verdict lines
# a terminal's escape sequences (CSI, OSC, DCS/PM/APC strings, the two-byte ones) and every other control
# character but tab and newline: a host's text must not move the cursor, clear the screen or set the title
ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]"
                     r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    """Text from a host (a log line, an error, a keeper's word) as a terminal may show it: its escape
    sequences and control characters taken out. Rich markup in it stays: show it as Text, or escaped."""
    return ESCAPES.sub("", text)


def bar(fraction: float | None, width: int) -> str:
    """A bar of `width` cells in eighths: 0.5 at 4 → ██░░."""
    if fraction is None:
        return " " * width
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + ("" if not part else " ▏▎▍▌▋▊▉"[part]) + "░" * width)[:width]


def _gpu_cells(row: HostRow, width: int, one_line: bool) -> list[Text]:
    if row.gpus is None:
        return [Text("no GPU".ljust(width), style="dim")]
    bar_w = GPU_BAR + width - GPU_W
    if one_line and len(row.gpus) > 1:
        utils = [g.util_percent for g in row.gpus if g.util_percent is not None]
        mean = sum(utils) / len(utils) if utils else None
        text = f"{len(row.gpus)}× {bar(mean / 100 if mean is not None else None, bar_w)} "
        text += f"{mean:3.0f}% ≥{min(utils):.0f}%" if utils else "  ?"
        return [Text(text[:width].ljust(width), style="green")]
    cells = []
    for g in row.gpus:
        util = f"{g.util_percent:3.0f}%" if g.util_percent is not None else "   ?"
        mem = (f"{g.mem_used_mb / 1024:.0f}/{g.mem_total_mb / 1024:.0f}G"
               if g.mem_used_mb is not None and g.mem_total_mb else "")
        frac = g.util_percent / 100 if g.util_percent is not None else None
        cells.append(Text(f"{g.index % 10} {bar(frac, bar_w)} {util} {mem}"[:width].ljust(width), style="green"))
    return cells


def _nic_cell(row: HostRow, link_mbps: float | None, width: int) -> Text:
    if row.nic_mbps is None:
        return Text("no sample yet".ljust(width), style="dim")
    head = f"↑{row.tx_mbps or 0:6.1f} ↓{row.rx_mbps or 0:6.1f} "
    bar_w = NIC_BAR + width - NIC_W
    if not link_mbps:
        return Text((head + "link ?").ljust(width))
    share = row.nic_mbps / link_mbps
    text = Text(head)
    text.append(bar(share, bar_w), style="red" if share > NIC_HOT else "cyan")
    text.append(f" {share:4.0%}".ljust(width - len(head) - bar_w))
    return text


def host_lines(screen: Screen, width: int, one_line_gpus: bool) -> list[Text]:
    name_w = max(4, min(12, max(len(h.name) for h in screen.hosts)))
    extra = max(width - (name_w + 1 + RANKS_W + 1 + STATE_W + 1 + GPU_W + 1 + NIC_W + 1 + CPU_W), 0)
    gpu_w, nic_w = GPU_W + extra // 2, NIC_W + extra - extra // 2
    lead_w = name_w + 1 + RANKS_W + 1 + STATE_W + 1
    header = Text(f"{'host':<{name_w}} {'ranks':<{RANKS_W}} {'state':<{STATE_W}} "
                  f"{'GPU util, memory':<{gpu_w}} {'NIC Mbit/s ↑tx ↓rx, of link':<{nic_w}} {'CPU':>{CPU_W}}",
                  style="bold")
    lines = [header]
    for row in screen.hosts:
        lead = f"{row.name[:name_w]:<{name_w}} {row.ranks:<{RANKS_W}} "
        if row.state in ("unreachable", "connecting"):
            line = Text(lead)
            said = f"unreachable: {plain(row.why or '')}" if row.state == "unreachable" else "connecting over SSH"
            line.append(said[: width - len(lead)], style="bold red" if row.state == "unreachable" else "dim")
            lines.append(line)
            continue
        gpus = _gpu_cells(row, gpu_w, one_line_gpus)
        for i, gpu in enumerate(gpus):
            line = Text(lead + f"{row.state:<{STATE_W}} " if i == 0 else " " * lead_w)
            line.append_text(gpu)
            if i == 0:
                line.append(" ")
                line.append_text(_nic_cell(row, screen.link_mbps, nic_w))
                cpu = f"{row.cpu_percent:.0f}%" if row.cpu_percent is not None else "?"
                line.append(f" {cpu:>{CPU_W}}")
            lines.append(line)
    return lines


def run_lines(screen: Screen) -> list[Text]:
    r = screen.run
    done = f" ({r.update / r.max_update:.0%})" if r.max_update else ""
    first = f"update {r.update}/{r.max_update or '?'}{done}"
    first += f" · loss {r.loss:.3f}" if r.loss is not None else " · loss ?"
    first += " · finished" if r.finished else f" · ETA {format_eta(r.eta_s)}"
    step = (f"s/update {r.last_s:.2f} last · {r.median_s:.2f} median" if r.last_s is not None and r.median_s
            else "s/update ?")
    step += f" · {r.wps:,.0f} words/s" if r.wps is not None else ""
    step += f" · fill {r.fill:.2f}" if r.wps is not None and r.fill is not None else ""
    link = (f"link {screen.link_mbps:g} Mbit/s: {screen.link_source}" if screen.link_mbps
            else f"link: {screen.link_source}")
    verdict = Text("⇒ " + screen.verdict, style="bold yellow" if screen.verdict.startswith("network-bound")
                   else "bold")
    changes = [Text(f"  {plain(line)}", style="cyan", overflow="ellipsis", no_wrap=True) for line in screen.membership]
    return [Text(first), Text(step), Text(link, style="dim", overflow="ellipsis", no_wrap=True), verdict,
            *([Text("membership (the hosts' keepers):", style="bold")] + changes if changes else [])]


def render(screen: Screen, width: int = 80, height: int = 24, every_s: float | None = 2.0) -> Group:
    """The whole view for a terminal of width × height (`every_s` None: one frame, printed)."""
    clock = time.strftime("%H:%M:%S", time.localtime(screen.at))
    live = f" · every {every_s:g} s · Ctrl-C leaves" if every_s else ""
    title = Text(f"tandem watch · {screen.run_id} · {clock}{live}", style="bold", overflow="ellipsis", no_wrap=True)
    per_gpu = sum(max(len(h.gpus or []), 1) if h.state not in ("unreachable", "connecting") else 1
                  for h in screen.hosts)
    one_line = per_gpu + FIXED_LINES > height
    return Group(title, *host_lines(screen, width, one_line), Text(""), *run_lines(screen))


def compact_line(row: HostRow, screen: Screen) -> Text:
    """One host in one line, under `fab train`'s progress bar: GPU %, NIC Mbit/s, s/update."""
    line = Text(f"  {row.name} ", style="bold")
    if "-" in row.ranks:  # several ranks on this host: which ones (rank 0's host shows s/update)
        line.append(f"ranks {row.ranks} · ")
    if row.state in ("unreachable", "connecting"):
        line.append(f"unreachable: {plain(row.why or '')}" if row.state == "unreachable" else "connecting over SSH",
                    style="red" if row.state == "unreachable" else "dim")
        return line
    if row.gpus is None:
        line.append("no GPU", style="dim")
    else:
        line.append("GPU " + " ".join(f"{g.util_percent:.0f}%" if g.util_percent is not None else "?"
                                     for g in row.gpus))
    if row.nic_mbps is not None:
        share = f" ({row.nic_mbps / screen.link_mbps:.0%} of link)" if screen.link_mbps else ""
        hot = screen.link_mbps and row.nic_mbps / screen.link_mbps > NIC_HOT
        line.append(" · NIC ")
        line.append(f"{row.nic_mbps:.1f} Mbit/s{share}", style="red" if hot else "")
    if row.cpu_percent is not None:
        line.append(f" · CPU {row.cpu_percent:.0f}%")
    if row.ranks.split("-")[0] == "0" and screen.run.last_s is not None:
        line.append(f" · {screen.run.last_s:.2f} s/update")
    return line
