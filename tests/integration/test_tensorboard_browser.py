"""The profiler seen as a user sees it: TensorBoard's PyTorch profiler plugin
(torch-tb-profiler) opened on a profiled npu training run, in headless Chromium.

Two sides: the plugin's JSON API (exact content: steps, kernels per op, the npu
device lane), and the page itself (overview, operator and trace views populated,
screenshots that are real images). Expected counts come from the model: a
32-64-10 MLP has 2 addmm per forward and 3 mm per backward (the first layer's
input needs no grad), over the 2 recorded steps of schedule(wait=1, warmup=1,
active=2); expected device times come from our kernel_details.csv.

The page loads Google Charts and a Web Components polyfill from the internet;
the browser here has none, so those two URLs are served locally (a stand-in that
draws each chart as a table of its data, gcharts_standin.js, and the polyfill
that tools/ensure_chromium.sh fetches from npm). Every other non-loopback request
is refused. TensorBoard listens on 127.0.0.1 only and is always ended.
"""
import csv
import glob
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from _headless_chromium import BrowserError, HeadlessChromium

HERE = Path(__file__).resolve().parent
PLUGIN = "/data/plugin/pytorch_profiler"
GCHARTS_URL = "https://www.gstatic.com/charts/loader.js"
POLYFILL_URL = "https://cdnjs.cloudflare.com/ajax/libs/webcomponentsjs/0.7.24/webcomponents.min.js"
POLYFILL = Path(sys.prefix, "share", "webcomponentsjs-0.7.24", "webcomponents.min.js")
RECORDED_STEPS = ["2", "3"]
KERNEL_CALLS = {"aten::addmm": 2 * 2, "aten::mm": 3 * 2, "aten::relu": 1 * 2}
WIDTH, HEIGHT = 1600, 1000
IN_CI = os.environ.get("CI") == "true"


def _need(found, what):
    """Skip (outside CI) or fail (CI=true) when a browser-side requirement is missing."""
    if found:
        return
    msg = f"{what} (make test-integration installs it: tools/ensure_chromium.sh)"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def chromium():
    """The chromium executable; checked before the run is profiled and served."""
    path = shutil.which("chromium")
    _need(path, "Debian's chromium is not installed")
    return path


# -- the profiled run and TensorBoard -------------------------------------------------
@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A small training run profiled with torch_npu.profiler into a log dir."""
    import torch
    import torch_npu
    import torch_npu.profiler as P

    logdir = tmp_path_factory.mktemp("tb_logs")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32, device="npu")
    y = torch.randint(0, 10, (16,), device="npu")
    with P.profile(activities=[P.ProfilerActivity.CPU, P.ProfilerActivity.NPU],
                   schedule=P.schedule(wait=1, warmup=1, active=2, repeat=1),
                   on_trace_ready=P.tensorboard_trace_handler(str(logdir), worker_name="worker0"),
                   record_shapes=True) as prof:
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    (run_dir,) = glob.glob(os.path.join(logdir, "*_ascend_pt"))
    (trace,) = glob.glob(os.path.join(run_dir, "*.pt.trace.json"))
    with open(os.path.join(run_dir, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"), newline="") as f:
        kernels = list(csv.DictReader(f))
    return {"logdir": str(logdir), "run": os.path.basename(run_dir),
            "worker": os.path.basename(trace)[:-len(".pt.trace.json")], "kernels": kernels,
            "device_name": torch.npu.get_device_name(0)}


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


@pytest.fixture(scope="module")
def tensorboard(profiled, tmp_path_factory):
    """TensorBoard on 127.0.0.1 serving the profiled run; yields its base URL once
    the plugin has loaded the run. Ended (its whole process group) at teardown."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("tb_server") / "tensorboard.log"
    log = open(log_path, "wb")
    # coreutils timeout: a backstop should this process die before the teardown runs
    proc = subprocess.Popen(["timeout", "-k", "5", "900", sys.executable, "-m", "tensorboard.main",
                             "--logdir", profiled["logdir"], "--host", "127.0.0.1", "--port", str(port)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"TensorBoard exited with status {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                runs = json.loads(_get(f"{base}{PLUGIN}/runs", timeout=5))
                if profiled["run"] in runs["runs"] and not runs["loading"]:
                    break
            except (urllib.error.URLError, ConnectionError, socket.timeout, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"TensorBoard did not list run {profiled['run']} within 180 s:\n"
                            f"{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()


def _api(base, route, profiled, **extra):
    query = {"run": profiled["run"], "worker": profiled["worker"], "span": "default", **extra}
    return json.loads(_get(f"{base}{PLUGIN}/{route}?{urllib.parse.urlencode(query)}"))


def _kernel_us(profiled, name):
    return sum(float(k["Duration(us)"]) for k in profiled["kernels"] if k["Name"] == name)


# -- the plugin's API: exact content ---------------------------------------------------
def test_plugin_lists_the_run_its_views_and_worker(tensorboard, profiled):
    runs = json.loads(_get(f"{tensorboard}{PLUGIN}/runs"))
    assert runs["runs"] == [profiled["run"]]
    views = json.loads(_get(f"{tensorboard}{PLUGIN}/views?run={profiled['run']}"))
    assert {"Overview", "Operator", "Kernel", "Trace"} <= set(views), views
    workers = json.loads(_get(f"{tensorboard}{PLUGIN}/workers?run={profiled['run']}&view=Overview"))
    assert workers == [profiled["worker"]]


def test_overview_has_the_recorded_steps_and_the_npu(tensorboard, profiled):
    data = _api(tensorboard, "overview", profiled)
    steps = data["steps"]["rows"]
    assert [row[0] for row in steps] == RECORDED_STEPS
    kernel_col = [c.get("name") for c in data["steps"]["columns"]].index("Kernel")
    assert all(row[kernel_col] > 0 for row in steps), steps
    summary = {d["title"]: d["value"] for d in data["gpu_metrics"]["data"]}
    assert summary["Name"] == profiled["device_name"]


def test_operator_view_has_kernel_counts_and_device_times(tensorboard, profiled):
    rows = {r["name"]: r for r in _api(tensorboard, "operation/table", profiled, group_by="Operation")["data"]}
    for op, calls in KERNEL_CALLS.items():
        assert rows[op]["calls"] == calls, (op, rows[op])
        # device self time = the kernels this op launched, as our kernel_details.csv lists them
        assert rows[op]["device_self_duration"] == pytest.approx(_kernel_us(profiled, op), abs=1.0), op
    pie = _api(tensorboard, "operation", profiled, group_by="Operation")
    assert pie["device_self_time"] is not None
    assert {"aten::addmm", "aten::mm"} <= {name for name, _ in pie["device_self_time"]["rows"]}


def test_trace_view_data_has_the_npu_device_lane(tensorboard, profiled):
    req = urllib.request.Request(f"{tensorboard}{PLUGIN}/trace?" + urllib.parse.urlencode(
        {"run": profiled["run"], "worker": profiled["worker"], "span": "default"}))
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    events = json.loads(body)["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert (0, "NPU 0") in names, names
    kernels = Counter(e["name"] for e in events if e.get("cat") == "kernel" and e.get("pid") == 0)
    assert sum(kernels.values()) == len(profiled["kernels"])
    for op, calls in KERNEL_CALLS.items():
        assert kernels[op] == calls, (op, kernels)


# -- the page in headless Chromium ------------------------------------------------------
def _check_png(path):
    """A PNG of the window's size that is not one flat colour."""
    from PIL import Image
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", path
    img = Image.open(path).convert("RGB")
    assert img.size == (WIDTH, HEIGHT), img.size
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50, f"{path} is nearly blank ({len(colours)} colours)"


_OPEN_VIEWS = """(() => {
  const label = [...document.querySelectorAll('li.MuiListSubheader-root')].find(e => e.textContent === 'Views');
  const select = label && label.nextElementSibling && label.nextElementSibling.querySelector('[aria-haspopup=listbox]');
  if (!select) return false;
  select.dispatchEvent(new MouseEvent('mousedown', {bubbles: true, button: 0}));
  return true; })()"""
_PICK = """((name) => {
  const option = [...document.querySelectorAll('li[role=option]')].find(e => e.textContent === name);
  if (!option) return false;
  option.click();
  return true; })(%s)"""
_TABLE_ROWS = ("[...document.querySelectorAll('.ant-table-tbody tr')]"
               ".map(tr => [...tr.cells].map(td => td.innerText))")
_TRACE_MODEL = """(() => {
  const frame = document.querySelector('iframe');
  const doc = frame && frame.contentDocument;
  const view = doc && doc.querySelector('tr-ui-timeline-view');
  const model = view && view.model;
  if (!model) return null;
  return model.getAllProcesses().map(p => ({pid: p.pid, label: p.userFriendlyName,
    slices: [].concat(...Object.values(p.threads).map(t => t.sliceGroup.slices.map(s => s.title)))})); })()"""


def _text(browser):
    return browser.evaluate("document.body ? document.body.innerText : ''")


def _choose_view(browser, name):
    """Pick ``name`` in the plugin's Views menu, as a person does."""
    browser.wait_for(_OPEN_VIEWS, timeout=30)
    browser.wait_for(_PICK % json.dumps(name), timeout=30)


def test_views_render_in_headless_chromium(chromium, tensorboard, profiled, tmp_path):
    _need(POLYFILL.is_file(), f"the trace view's polyfill is missing at {POLYFILL}")
    substitutes = {GCHARTS_URL: ("text/javascript", (HERE / "gcharts_standin.js").read_bytes()),
                   POLYFILL_URL: ("text/javascript", POLYFILL.read_bytes())}
    profile_dir = tmp_path / "chromium-profile"
    profile_dir.mkdir()
    shots = {}
    try:
        with HeadlessChromium(chromium, str(profile_dir), str(tmp_path / "chromium.log"), substitutes,
                              WIDTH, HEIGHT) as browser:
            browser.open(f"{tensorboard}{PLUGIN}/index.html")

            # Overview: the default view. Its panels fetch their data separately and
            # fill in one by one, so wait for all of them, then say which is missing.
            expected_text = ("Step Time Breakdown", "GPU Summary", profiled["device_name"],
                             "Execution Summary", profiled["run"])
            everything = " && ".join(["document.body"] + [
                f"document.body.innerText.includes({json.dumps(t)})" for t in expected_text] + [
                "document.querySelectorAll('[data-chart=SteppedAreaChart] tr').length > "
                f"{len(RECORDED_STEPS)}"])
            try:
                browser.wait_for(everything, 90)
            except BrowserError:
                pass            # the assertions below name what never appeared
            text = _text(browser)
            for expected in expected_text:
                assert expected in text, expected
            steps = browser.evaluate("[...document.querySelectorAll('[data-chart=SteppedAreaChart] tr')]"
                                     ".slice(1).map(tr => tr.cells[0].innerText)")
            assert steps == RECORDED_STEPS
            shots["overview"] = tmp_path / "overview.png"
            browser.screenshot(shots["overview"])
            assert "Step Time Breakdown" in browser.dom()

            # Operator: the table lists the ops with their kernel counts and device time
            _choose_view(browser, "Operator")
            browser.wait_for(f"{_TABLE_ROWS}.length > 0", 60)
            heads = browser.evaluate("[...document.querySelectorAll('.ant-table-thead th')].map(th => th.innerText)")
            rows = {r[0]: dict(zip(heads, r)) for r in browser.evaluate(_TABLE_ROWS)}
            for op, calls in KERNEL_CALLS.items():
                assert rows[op]["Calls"] == str(calls), rows.get(op)
                assert float(rows[op]["Device Self Duration (us)"]) == pytest.approx(
                    _kernel_us(profiled, op), abs=1.0), op
            assert "Device Self Time (us)" in _text(browser)
            shots["operator"] = tmp_path / "operator.png"
            browser.screenshot(shots["operator"])

            # Trace: the trace viewer's model has the npu lane with every kernel on it
            _choose_view(browser, "Trace")
            processes = browser.wait_for(_TRACE_MODEL, 120)
            npu = [p for p in processes if p["pid"] == 0]
            assert npu and npu[0]["label"].startswith("NPU 0"), processes
            assert len(npu[0]["slices"]) == len(profiled["kernels"])
            assert Counter(npu[0]["slices"])["aten::mm"] == KERNEL_CALLS["aten::mm"]
            assert "NPU 0" in browser.evaluate(
                "document.querySelector('iframe').contentDocument.body.innerText")
            shots["trace"] = tmp_path / "trace.png"
            browser.screenshot(shots["trace"])
            assert browser.refused == [], browser.refused
    except BrowserError as e:
        log = (tmp_path / "chromium.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"{e}\nchromium log:\n{log}")
    for path in shots.values():
        _check_png(path)
    print("screenshots:", *map(str, shots.values()))


def test_documented_screenshot_command(chromium, tensorboard, profiled, tmp_path):
    """docs/profiler.md's command line, as given: --screenshot writes a PNG of the
    page and --dump-dom prints a DOM that lists the run and the Overview view.
    (Offline the charts do not load here; the views above are checked with them.)"""
    url = f"{tensorboard}{PLUGIN}/index.html"
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=20000",
              f"--user-data-dir={tmp_path / 'profile'}",
              "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]   # loopback only
    shot = tmp_path / "overview.png"
    subprocess.run(common + [f"--screenshot={shot}", url], check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _check_png(shot)
    dom = subprocess.run(common + ["--dump-dom", url], check=True, timeout=120, capture_output=True,
                         text=True).stdout
    assert profiled["run"] in dom
    assert 'value="Overview"' in dom
