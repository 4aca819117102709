/**
 * The panel's requests to the kernel, and whether the kernel is still there.
 *
 * A click that opens the inspector and a slider that re-classifies write a trait and wait
 * for Python. Python acknowledges each one with a custom message `{answer: kind}` once it
 * has handled it (`notebook/panel.py`), whatever it concluded. A request with no answer
 * within `REQUEST_TIMEOUT_MS` says so (`NO_ANSWER`) instead of waiting forever; a late
 * answer still lands and clears the message. While the cell is training, the kernel reads
 * the panel's messages only when the cell ends, so requests made then are not timed.
 *
 * The kernel is gone when the widget's model is closed (its comm closed, or the widget
 * manager cleared: `destroy`), when its comm is no longer live (`comm_live_update`, which
 * the widget manager fires only on losing it: a restart), when sending to it throws, or when
 * a request finds the widget manager without a kernel, or with a dead one (a shutdown from
 * the Kernel menu or the server: JupyterLab's and Notebook 7's manager tell their models
 * nothing then; `managerKernelGone`).
 */
import type { PanelModel } from "./model";

export type RequestKind = "selected" | "thresholds";

/** How long a request waits for the kernel's answer. */
export const REQUEST_TIMEOUT_MS = 5_000;

export const NO_ANSWER =
  "the kernel does not answer: it may have been restarted or shut down (or be busy running " +
  "another cell); re-run the cell for a live panel";

export const KERNEL_GONE =
  "the kernel is gone (restarted or shut down): clicks and sliders are not answered; the " +
  "diagnosis below is this run's last state. Re-run the cell for a live panel";

export interface RequestOptions {
  /** No answer to `kind` in time. */
  onTimeout(kind: RequestKind): void;
  /** Python answered `kind` while it waited. */
  onAnswer(kind: RequestKind): void;
  /** The kernel is gone: called once. */
  onGone(): void;
  /** Are requests timed now? (Not while the cell trains.) */
  timed(): boolean;
  /** Is the kernel known to be gone, by other means than the model's events? */
  kernelGone?(): boolean;
  timeoutMs?: number;
}

export interface Requests {
  /** A request of `kind` was sent (or is about to be): time it. */
  ask(kind: RequestKind): void;
  /** Run `send` (a write to the kernel); a throw means the kernel is gone. */
  send(send: () => void): void;
  /** `kind` is answered (Python's acknowledgement, or a trait change that answers it). */
  answer(kind: RequestKind): void;
  /** Is `kind` waiting for an answer? */
  pending(kind: RequestKind): boolean;
  readonly gone: boolean;
  dispose(): void;
}

interface ManagerKernel {
  status?: string;
}

/**
 * Does the model's widget manager (JupyterLab's, Notebook 7's: `kernel` is the notebook
 * session's kernel) say the kernel is gone: none, or dead? A manager without a `kernel`
 * (other front ends) says nothing: false.
 */
export function managerKernelGone(model: unknown): boolean {
  const manager = (model as { widget_manager?: unknown } | null)?.widget_manager;
  if (typeof manager !== "object" || manager === null || !("kernel" in manager)) return false;
  const kernel = (manager as { kernel?: ManagerKernel | null }).kernel;
  return kernel == null || kernel.status === "dead";
}

function isAnswer(content: unknown): content is { answer: RequestKind } {
  return typeof content === "object" && content !== null && "answer" in content;
}

export function createRequests(model: PanelModel, options: RequestOptions): Requests {
  const timeoutMs = options.timeoutMs ?? REQUEST_TIMEOUT_MS;
  /** Requests not answered yet, each with its timer (null: not timed, or timed out). */
  const timers = new Map<RequestKind, ReturnType<typeof setTimeout> | null>();
  let gone = false;

  function clear(kind: RequestKind): void {
    const timer = timers.get(kind);
    if (timer != null) clearTimeout(timer);
    timers.delete(kind);
  }

  function lose(): void {
    if (gone) return;
    gone = true;
    for (const kind of [...timers.keys()]) clear(kind);
    options.onGone();
  }

  function answer(kind: RequestKind): void {
    const waited = timers.has(kind);
    clear(kind);
    if (waited) options.onAnswer(kind);
  }

  const onMessage = (content: unknown): void => {
    if (isAnswer(content)) answer(content.answer);
  };
  model.on("msg:custom", onMessage);
  model.on("comm_live_update", lose);
  model.on("destroy", lose);

  return {
    ask(kind) {
      clear(kind);
      if (!gone && options.kernelGone?.()) lose();
      if (gone) {
        options.onTimeout(kind);
        return;
      }
      const timed = options.timed();
      timers.set(kind, timed ? setTimeout(() => {
        timers.set(kind, null); // still waiting: a late answer clears the message
        if (options.kernelGone?.()) lose();
        options.onTimeout(kind);
      }, timeoutMs) : null);
    },
    send(send) {
      if (gone) return;
      try {
        send();
      } catch {
        lose();
      }
    },
    answer,
    pending(kind) {
      return timers.has(kind);
    },
    get gone() {
      return gone;
    },
    dispose() {
      for (const kind of [...timers.keys()]) clear(kind);
      model.off("msg:custom", onMessage);
      model.off("comm_live_update", lose);
      model.off("destroy", lose);
    },
  };
}
