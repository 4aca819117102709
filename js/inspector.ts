/**
 * The inspector under the map: HTML built by our own Python side (charts, numbers, the line
 * of code that reaches the tensors), shown as is, with a close button. After a click it
 * says it is waiting until Python sends the HTML for it (during a run, clicks reach the
 * kernel only when the cell finishes).
 */
import { isSelected, type Selection } from "./model";

export interface InspectorView {
  readonly el: HTMLElement;
  /** HTML from Python, for the selection current when it arrived; empty hides it. */
  setHtml(html: string, selection: Selection | null): void;
  /** The user asked for `selection`: open it, waiting for Python unless its HTML is here. */
  expect(selection: Selection): void;
  /** Is it waiting for Python's HTML? */
  readonly waiting: boolean;
  /** Python did not answer: stop waiting and say `why` in the bar. */
  fail(why: string): void;
}

export interface InspectorOptions {
  onClose(): void;
}

export function selectionLabel(sel: Selection): string {
  return `${sel.layer ?? "data / loss"} \u00b7 step ${sel.step}`;
}

export function createInspector(parent: HTMLElement, options: InspectorOptions): InspectorView {
  const root = document.createElement("div");
  root.className = "ndbg-inspector";
  root.hidden = true;
  const bar = document.createElement("div");
  bar.className = "ndbg-inspector-bar";
  const title = document.createElement("span");
  title.className = "ndbg-inspector-title";
  const status = document.createElement("span");
  status.className = "ndbg-inspector-status";
  const close = document.createElement("button");
  close.type = "button";
  close.className = "ndbg-inspector-close";
  close.title = "close the inspector";
  close.setAttribute("aria-label", "close the inspector");
  close.textContent = "\u00d7";
  bar.append(title, status, close);
  const body = document.createElement("div");
  body.className = "ndbg-inspector-body";
  root.append(bar, body);
  parent.appendChild(root);

  let html = "";
  let htmlFor: Selection | null = null;
  let open = false;
  let waiting = false;
  let failed = "";

  function refresh(): void {
    root.hidden = !open || (!waiting && failed === "" && html === "");
    root.classList.toggle("ndbg-waiting", waiting);
    // Nothing to show yet (the first click): the bar alone says it is waiting.
    body.hidden = html === "";
    root.classList.toggle("ndbg-inspector-empty", html === "");
    root.classList.toggle("ndbg-inspector-failed", failed !== "");
    status.textContent = waiting ? "waiting for the kernel\u2026" : failed;
  }

  close.addEventListener("click", () => {
    open = false;
    waiting = false;
    failed = "";
    refresh();
    options.onClose();
  });

  return {
    el: root,
    setHtml(next, selection) {
      html = next;
      htmlFor = selection;
      body.innerHTML = next;
      open = next !== "";
      waiting = false;
      failed = "";
      title.textContent = selection ? selectionLabel(selection) : "";
      refresh();
    },
    expect(selection) {
      open = true;
      waiting = !(html !== "" && htmlFor !== null && isSelected(selection, htmlFor));
      failed = "";
      title.textContent = selectionLabel(selection);
      refresh();
    },
    get waiting() {
      return waiting;
    },
    fail(why) {
      if (!open) return;
      waiting = false;
      failed = why;
      refresh();
    },
  };
}
