"""The screenshots of docs/view.md: ``hybridflow view`` over a run folder in headless Chromium.

    python tests/view/screenshots.py RUN_DIR OUT_DIR [--prefix view_] [--row N] [--step N] [--filter TEXT]

Writes ``{prefix}curves.png``, ``{prefix}rollout.png`` (a row of the newest rollout step, with
its token colours) and ``{prefix}timing.png``. Needs selenium, chromium and chromedriver.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from view.conftest import Served  # noqa: E402


def wait_for(driver, script: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(f"return {script}"):
        assert time.monotonic() < deadline, script
        time.sleep(0.1)


def main() -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--prefix", default="view_")
    parser.add_argument("--row", type=int, default=0, help="dump line to open; 0 = the first with a non-zero advantage")
    parser.add_argument("--step", type=int, default=None, help="rollout step to show (default: the newest)")
    parser.add_argument("--filter", default="", help="metric-name filter for the curves")
    args = parser.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    served = Served([args.run_dir])
    try:
        shots = {
            "curves": "?tab=curves",
            "rollout": "?tab=rollouts",
            "timing": "?tab=timing",
        }
        for name, query in shots.items():
            driver.get(served.url + query)
            wait_for(driver, "document.body.dataset.ready === '1'")
            if name == "curves" and args.filter:
                driver.find_element("id", "metric-filter").send_keys(args.filter)
                wait_for(driver, "document.body.dataset.curves === 'done'")
            if name == "rollout" and args.step is not None:
                driver.execute_script(
                    f"const s = document.getElementById('ro-step'); s.value = '{args.step}';"
                    "s.dispatchEvent(new Event('change'))"
                )
                wait_for(driver, f"RO.rows.length && RO.rows[0].step === {args.step}")
            if name == "rollout":
                row = args.row or driver.execute_script(
                    "const r = RO.rows.find(r => (r.advantages || []).some(a => a)); return r ? r._line : 1"
                )
                driver.find_element("css selector", f'#ro-table tbody tr[data-line="{row}"]').click()
                wait_for(driver, "document.querySelector('#ro-conversation .turn')")
                driver.execute_script("document.querySelector('.table-wrap').scrollLeft = 0")
            time.sleep(1.0)
            driver.save_screenshot(str(args.out_dir / f"{args.prefix}{name}.png"))
            print(args.out_dir / f"{args.prefix}{name}.png")
    finally:
        driver.quit()
        served.stop()


if __name__ == "__main__":
    main()
