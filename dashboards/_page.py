"""The page skeleton shared by the dashboards: CSS, the plotly loader, escaping and formatting.

Every page is one self-contained HTML file: no network, no external file. Pages that chart
carry plotly.js once, gzip-compressed and base64-encoded (4.8 MB of plotly.min.js becomes
2.0 MB, which keeps a 2,000-row run report well under 5 MB); a small loader inflates it with the
browser's ``DecompressionStream`` (Chrome 80+, Firefox 113+, Safari 16.4+) and draws every figure
stored as JSON in ``<script type="application/json" class="pt-figure">`` blocks. Everything a
reader needs first (verdict, first divergence, tables) is plain HTML, so a page still reads when
scripts are blocked; the MLflow UI shows HTML artifacts in an ``<iframe sandbox="allow-scripts">``
loaded from a ``blob:`` URL (MLflow 3.x ``ShowArtifactHtmlView``), where scripts do run but the
origin is opaque: the pages use no storage, cookies, popups or top-level navigation.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

#: Colours per comparison status (design.md, "Statuses"): (foreground, background).
STATUS_COLORS: dict[str, tuple[str, str]] = {
    "equal": ("#1b5e20", "#e8f5e9"),
    "close": ("#00695c", "#e0f2f1"),
    "mismatch": ("#b71c1c", "#ffebee"),
    "shape_mismatch": ("#880e4f", "#fce4ec"),
    "missing_reference": ("#4a148c", "#f3e5f5"),
    "missing_candidate": ("#4a148c", "#f3e5f5"),
    "skipped": ("#616161", "#f5f5f5"),
    "error": ("#bf360c", "#fff3e0"),
}
#: Marker colours for charts, one per status.
STATUS_MARKERS: dict[str, str] = {
    "equal": "#43a047",
    "close": "#26a69a",
    "mismatch": "#e53935",
    "shape_mismatch": "#d81b60",
    "missing_reference": "#8e24aa",
    "missing_candidate": "#8e24aa",
    "skipped": "#9e9e9e",
    "error": "#fb8c00",
}
PASSING = frozenset({"equal", "close"})
#: Statuses that count as a parity failure (``skipped`` neither passes nor fails).
FAILING = frozenset(
    {"mismatch", "shape_mismatch", "missing_reference", "missing_candidate", "error"}
)

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#212121;
background:#fafafa}
main{max-width:1400px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:4px}h3{font-size:15px;margin:14px 0 6px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.verdict{padding:14px 20px;color:#fff}
.verdict .word{font-size:26px;font-weight:700;letter-spacing:.5px}
.verdict .line{font-size:15px;margin-top:2px;word-break:break-word}
.verdict a{color:#fff}
.v-pass{background:#2e7d32}.v-fail{background:#c62828}.v-error{background:#e65100}
.v-expected{background:#f9a825;color:#212121}.v-expected a{color:#212121}
.v-regression{background:#7f0000}.v-neutral{background:#546e7a}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #e0e0e0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#eceff1;font-weight:600;white-space:nowrap}
table.kv th{width:170px}
table.data td{white-space:nowrap}
table.data td.msg{white-space:normal;max-width:380px;overflow-wrap:anywhere;color:#555}
td.num{text-align:right;font-variant-numeric:tabular-nums}
#modules-table td:nth-child(-n+3),#modules-table td:nth-child(n+7):nth-child(-n+11),
#ops-table td:nth-child(1),#ops-table td:nth-child(6),#ops-table td:nth-child(7)
{text-align:right;font-variant-numeric:tabular-nums}
#modules-table td:nth-child(4){white-space:normal;overflow-wrap:break-word;min-width:260px;
max-width:460px}
#modules-table td:nth-child(4),#modules-table td:nth-child(12),#modules-table td:nth-child(13),
#ops-table td:nth-child(2),#ops-table td:nth-child(8),#ops-table td:nth-child(9)
{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
#modules-table td:nth-child(17),#ops-table td:nth-child(10)
{white-space:normal;min-width:280px;max-width:420px;overflow-wrap:break-word;color:#555}
table.data{font-size:13px}
th[data-sort]{cursor:pointer;user-select:none}
th[data-sort]:after{content:" \\2195";color:#90a4ae;font-weight:400}
th.asc:after{content:" \\25B2";color:#37474f}th.desc:after{content:" \\25BC";color:#37474f}
.st{font-weight:600;border-radius:3px;padding:0 5px;display:inline-block}
.chips{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}
.chip{border-radius:12px;padding:2px 10px;font-weight:600;border:1px solid rgba(0,0,0,.08)}
.note{color:#616161;font-size:13px}
.box{background:#fff;border:1px solid #e0e0e0;border-radius:4px;padding:10px 14px;margin:8px 0}
.box.bad{border-left:5px solid #c62828}.box.good{border-left:5px solid #2e7d32}
.chart{background:#fff;border:1px solid #e0e0e0;min-height:120px}
.chart .placeholder{padding:24px;color:#757575}
.controls{margin:6px 0;display:flex;gap:10px;align-items:center;flex-wrap:wrap}
.controls input[type=search]{width:280px;padding:3px 6px}
.scroll{overflow-x:auto;max-width:100%}
tr.first-div td{outline:2px solid #b71c1c;outline-offset:-2px}
tr.root td{background:#fff8e1}
.matrix td.cell{padding:0;min-width:150px}
.matrix td.cell a,.matrix td.cell div.inner{display:block;padding:6px 8px;color:inherit;
text-decoration:none}
.matrix td.cell a:hover{filter:brightness(.95);text-decoration:underline}
.matrix td.empty{background:#fafafa;color:#bdbdbd;text-align:center;vertical-align:middle}
.cs{font-weight:700;text-transform:uppercase;font-size:12px;letter-spacing:.4px}
.c-pass{background:#c8e6c9;color:#1b5e20}.c-fail{background:#ffcdd2;color:#b71c1c}
.c-regression{background:#b71c1c;color:#fff}.c-expected{background:#fff59d;color:#5d4037}
.c-error{background:#ffe0b2;color:#bf360c}
details summary{cursor:pointer;color:#37474f}
.meta{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:3px 18px;
margin:6px 0;background:#fff;border:1px solid #e0e0e0;border-radius:4px;padding:8px 12px}
.meta div{overflow-wrap:anywhere}.meta .wide{grid-column:1/-1}
.meta b{color:#546e7a;font-weight:600;margin-right:8px;white-space:nowrap}
h1 .note{font-size:16px;font-weight:400}
tr.reg td{background:#ffebee}tr.reg td:first-child{border-left:4px solid #b71c1c}
"""

# Inflates the gzip+base64 plotly.js, runs it, then draws every stored figure. Sets
# <body data-charts="ready|unavailable|failed"> so a reader (or a test) knows the outcome.
_LOADER_JS = """
(function(){
  var body=document.body;
  function notes(msg){document.querySelectorAll('.chart .placeholder').forEach(function(p){
    p.textContent=msg;});}
  function draw(){
    var figs=document.querySelectorAll('script.pt-figure');
    for(var i=0;i<figs.length;i++){
      var el=document.getElementById(figs[i].getAttribute('data-target'));
      var fig=JSON.parse(figs[i].textContent);
      el.innerHTML='';
      Plotly.newPlot(el,fig.data,fig.layout,{displaylogo:false,responsive:true});
    }
    body.setAttribute('data-charts','ready');
  }
  var src=document.getElementById('pt-plotly-gz');
  if(!src){return;}
  if(typeof DecompressionStream==='undefined'){
    body.setAttribute('data-charts','unavailable');
    notes('Charts need a browser with DecompressionStream (Chrome 80+, Firefox 113+, '+
      'Safari 16.4+); the tables hold the same data.');
    return;
  }
  var bin=atob(src.textContent.replace(/\\s+/g,''));
  var bytes=new Uint8Array(bin.length);
  for(var i=0;i<bin.length;i++){bytes[i]=bin.charCodeAt(i);}
  var stream=new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
  new Response(stream).text().then(function(code){
    var s=document.createElement('script');s.text=code;document.head.appendChild(s);
    draw();
  }).catch(function(err){
    body.setAttribute('data-charts','failed');
    notes('Charts could not be drawn: '+err+'. The tables hold the same data.');
  });
})();
"""

# Sort (click a header) and filter (text, status, kind) for tables with class "sortable".
# Cells hold display text only (no data attributes, to keep big tables small): numbers are parsed
# back from it ("—" sorts last, "∞" as Infinity, "3/40960" as 3).
_TABLE_JS = """
(function(){
  function num(t){
    t=t.trim();if(t==='∞')return Infinity;if(t==='-∞')return -Infinity;
    var f=parseFloat(t);return isNaN(f)?null:f;
  }
  function val(td,type){return type==='num'?num(td.textContent):td.textContent.toLowerCase();}
  function col(table,name){
    var ths=table.tHead.rows[0].cells;
    for(var i=0;i<ths.length;i++){if(ths[i].getAttribute('data-col')===name)return i;}
    return -1;
  }
  document.querySelectorAll('table.sortable').forEach(function(table){
    var tbody=table.tBodies[0];
    table.querySelectorAll('th[data-sort]').forEach(function(th){
      th.addEventListener('click',function(){
        var idx=th.cellIndex,type=th.getAttribute('data-sort');
        var asc=!th.classList.contains('asc');
        table.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc');});
        th.classList.add(asc?'asc':'desc');
        var rows=Array.prototype.slice.call(tbody.rows);
        var keyed=rows.map(function(r,i){return [val(r.cells[idx],type),i,r];});
        keyed.sort(function(a,b){
          var x=a[0],y=b[0];
          if(x===y)return a[1]-b[1];if(x===null)return 1;if(y===null)return -1;
          return (x<y?-1:1)*(asc?1:-1);
        });
        var frag=document.createDocumentFragment();
        keyed.forEach(function(k){frag.appendChild(k[2]);});
        tbody.appendChild(frag);
      });
    });
  });
  document.querySelectorAll('.controls[data-for]').forEach(function(ctl){
    ctl.hidden=false;
    var table=document.getElementById(ctl.getAttribute('data-for'));
    var rows=Array.prototype.slice.call(table.tBodies[0].rows);
    var failing=(ctl.getAttribute('data-failing')||'').split(',');
    var ct=col(table,'tag'),cs=col(table,'status'),ck=col(table,'kind');
    var text=ctl.querySelector('input[type=search]');
    var status=ctl.querySelector('select[name=status]');
    var kind=ctl.querySelector('select[name=kind]');
    var count=ctl.querySelector('.count');
    function apply(){
      var q=(text.value||'').toLowerCase(),s=status.value,k=kind?kind.value:'',n=0;
      rows.forEach(function(r){
        var st=r.cells[cs].textContent.trim();
        var ok=(!q||r.cells[ct].textContent.toLowerCase().indexOf(q)>=0)&&
          (!s||(s==='failing'?failing.indexOf(st)>=0:st===s))&&
          (!k||r.cells[ck].textContent.trim()===k);
        r.hidden=!ok;if(ok)n++;
      });
      count.textContent=n+' of '+rows.length+' rows';
    }
    [text,status,kind].forEach(function(el){if(el){el.addEventListener('input',apply);}});
    apply();
  });
})();
"""


@functools.lru_cache(maxsize=1)
def plotly_payload() -> str:
    """plotly.min.js (the copy bundled with the ``plotly`` package), gzip'd and base64-encoded.

    Computed once per process (about 0.2 s); the result is about 2.0 MB of ASCII.
    """
    from plotly.offline import get_plotlyjs

    raw = get_plotlyjs().encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def esc(value: Any) -> str:
    """HTML-escape ``str(value)``; ``None`` becomes an empty string."""
    return "" if value is None else html.escape(str(value), quote=True)


def fmt_num(value: Any, digits: int = 3) -> str:
    """A float in short scientific-or-fixed form (``1.23e-05``, ``0``, ``inf``); None → ``—``."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if v == 0:
        return "0"
    if 1e-2 <= abs(v) < 1e5:
        return f"{v:.{digits + 1}g}"
    return f"{v:.{digits - 1}e}"


def fmt_shape(shape: Any) -> str:
    """``[1, 3, 64]`` for a list of ints; ``—`` for None."""
    return "—" if shape is None else "[" + ", ".join(str(int(s)) for s in shape) + "]"


def finite(value: Any) -> float | None:
    """``float(value)`` when it is a finite number, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def status_badge(status: str | None) -> str:
    """A coloured ``<span>`` for a comparison status (colours from ``STATUS_COLORS``)."""
    cls = f" s-{status}" if status in STATUS_COLORS else ""
    return f"<span class='st{cls}'>{esc(status or '—')}</span>"


def _status_css() -> str:
    return "".join(f".s-{k}{{color:{fg};background:{bg}}}" for k, (fg, bg) in STATUS_COLORS.items())


def link(base_url: str, path: str | None, label: str) -> str:
    """``<a href=base_url+path>label</a>``; absolute paths and URLs are used as they are."""
    if not path:
        return ""
    href = path if "://" in path or path.startswith("/") else base_url + quote(path, safe="/")
    return f'<a href="{esc(href)}" title="{esc(path)}">{esc(label)}</a>'


def figure_block(fig_id: str, figure: Mapping[str, Any], *, height: int, placeholder: str) -> str:
    """A chart ``<div>`` plus its figure as inert JSON, drawn by the loader once plotly runs.

    Args:
        fig_id: the div's id (unique in the page).
        figure: a plotly figure dict ``{"data": [...], "layout": {...}}``.
        height: the div's height in CSS pixels.
        placeholder: text shown until (or unless) the chart is drawn.
    """
    try:
        text = json.dumps(figure, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or inf slipped in (e.g. an MLflow metric): JSON has no such value
        text = json.dumps(_finite_only(figure), separators=(",", ":"), allow_nan=False)
    payload = text.replace("</", "<\\/")
    return (
        f'<div class="chart" id="{esc(fig_id)}" style="height:{height}px">'
        f'<div class="placeholder">{esc(placeholder)}</div></div>'
        f'<script type="application/json" class="pt-figure" data-target="{esc(fig_id)}">'
        f"{payload}</script>"
    )


def _finite_only(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (plotly draws a gap)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_only(v) for v in value]
    return value


def json_script(element_id: str, data: Any) -> str:
    """Inert JSON data in a ``<script type="application/json">`` (``</`` escaped)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'


def page(title: str, banner: str, body: str, *, charts: bool, tables: bool) -> str:
    """Assemble a full, self-contained HTML document.

    Args:
        title: the ``<title>``.
        banner: HTML placed above ``<main>`` (the verdict bar).
        body: the main HTML.
        charts: embed plotly.js (compressed) and the figure loader.
        tables: embed the sort/filter script for ``table.sortable``.
    """
    scripts = []
    if tables:
        scripts.append(f"<script>{_TABLE_JS}</script>")
    if charts:
        scripts.append(
            f'<script type="application/octet-stream" id="pt-plotly-gz">{plotly_payload()}'
            f"</script><script>{_LOADER_JS}</script>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}{_status_css()}</style></head>"
        f'<body data-charts="{"pending" if charts else "none"}">{banner}<main>{body}'
        '<noscript><p class="note">Scripts are off: charts, sorting and filtering are '
        "unavailable; everything else on this page is plain HTML.</p></noscript></main>"
        + "".join(scripts)
        + "</body></html>\n"
    )


def chips(counts: Mapping[str, int], order: Iterable[str]) -> str:
    """Coloured ``status: count`` chips, in ``order`` then any other status."""
    keys = [k for k in order if counts.get(k)] + sorted(k for k in counts if k not in order)
    out = []
    for key in keys:
        fg, bg = STATUS_COLORS.get(key, ("#212121", "#eeeeee"))
        out.append(
            f'<span class="chip" style="color:{fg};background:{bg}">'
            f"{esc(key)}: {counts[key]}</span>"
        )
    return '<div class="chips">' + "".join(out) + "</div>"
