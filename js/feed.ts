/**
 * The first failure, pinned in one sentence with its likely causes under it (a learning
 * rate moved, weights changed outside the optimizer), and the event feed: causes in step
 * order with their symptoms grouped under them. Long feeds render only their latest rows.
 */
import { watchedNothing } from "./header";
import { eventPick, firstPicked, pickedIds, type FirstFailure, type PanelEvent, type Clicked, type Snapshot } from "./model";

/** Rows rendered at most (causes + symptoms); earlier groups collapse into one line. */
export const FEED_CAP = 200;
/** Symptoms shown under one cause at most. */
export const SYMPTOM_CAP = 20;

export interface FeedGroup {
  cause: PanelEvent;
  symptoms: PanelEvent[];
  /** Symptoms of this cause not rendered. */
  moreSymptoms: number;
  /** Later events this row stands for: the same warning of the layer again (and its
   * recoveries in between), a value flickering around its line (`flickers`). */
  repeats: number;
  /** Step of the last event the row stands for (the cause's own without repeats). */
  lastStep: number;
}

/** A warning of one layer that comes back this many times (without symptoms, each undone
 * by a recovery) is one feed row, "on and off": a value hovering at its threshold. */
export const FLICKER_MIN = 3;

type Entry = [PanelEvent, PanelEvent[]];

/**
 * Fold each layer's flickering warning into its first row: where a warning kind of a layer
 * starts `FLICKER_MIN` times or more as a cause without symptoms, its later starts and the
 * layer's recoveries after the first become that row's `repeats`. Errors are never folded.
 */
export function flickers(all: readonly Entry[]): { entries: Entry[]; repeats: Map<PanelEvent, [number, number]> } {
  const flicker = (c: PanelEvent, symptoms: PanelEvent[]): boolean =>
    symptoms.length === 0 && c.layer !== null && c.severity === "warning";
  const count = new Map<string, number>();
  for (const [c, symptoms] of all) {
    if (flicker(c, symptoms)) count.set(`${c.layer}\u0000${c.kind}`, (count.get(`${c.layer}\u0000${c.kind}`) ?? 0) + 1);
  }
  const open = new Map<string, PanelEvent>(); // layer -> its folded row's cause
  const repeats = new Map<PanelEvent, [number, number]>();
  const entries: Entry[] = [];
  for (const entry of all) {
    const [c, symptoms] = entry;
    const key = `${c.layer}\u0000${c.kind}`;
    const head = c.layer !== null ? open.get(c.layer) : undefined;
    const absorbed =
      head !== undefined &&
      symptoms.length === 0 &&
      ((c.kind === head.kind && c.severity === "warning") || (c.kind === "recovery" && c.severity === "info"));
    if (absorbed) {
      const [n] = repeats.get(head) ?? [0, head.step];
      repeats.set(head, [n + 1, c.step]);
      continue;
    }
    if (c.layer !== null && c.severity === "error") open.delete(c.layer);
    if (flicker(c, symptoms) && (count.get(key) ?? 0) >= FLICKER_MIN && c.layer !== null) open.set(c.layer, c);
    entries.push(entry);
  }
  return { entries, repeats };
}

export interface FeedLayout {
  groups: FeedGroup[];
  /** Events in earlier groups not rendered. */
  hidden: number;
}

/** The root cause an event descends from through `symptom_of`, or the event itself. */
function rootOf(ev: PanelEvent, byId: Map<number, PanelEvent>): PanelEvent {
  let cur = ev;
  for (let hops = 0; cur.symptom_of !== null && hops < 64; hops++) {
    const cause = byId.get(cur.symptom_of);
    if (!cause || cause === cur) break;
    cur = cause;
  }
  return cur;
}

/**
 * The feed's groups, latest first kept within `cap` rows; a cause in `expanded` (by id)
 * shows all its symptoms, the others `symptomCap` at most.
 */
export function buildFeed(
  events: readonly PanelEvent[],
  cap = FEED_CAP,
  symptomCap = SYMPTOM_CAP,
  expanded: ReadonlySet<number> = new Set(),
): FeedLayout {
  const byId = new Map<number, PanelEvent>();
  for (const ev of events) byId.set(ev.id, ev);
  const groups = new Map<PanelEvent, PanelEvent[]>();
  for (const ev of events) {
    const root = rootOf(ev, byId);
    let symptoms = groups.get(root);
    if (!symptoms) {
      symptoms = [];
      groups.set(root, symptoms);
    }
    if (root !== ev) symptoms.push(ev);
  }
  const { entries: all, repeats } = flickers([...groups.entries()]);
  const out: FeedGroup[] = [];
  let rows = 0;
  let shownEvents = 0;
  for (let i = all.length - 1; i >= 0; i--) {
    const [cause, symptoms] = all[i]!;
    const shown = expanded.has(cause.id) ? symptoms : symptoms.slice(0, symptomCap);
    const cost = 1 + shown.length + (symptoms.length > shown.length ? 1 : 0);
    if (out.length > 0 && rows + cost > cap) break;
    rows += cost;
    const [again, lastStep] = repeats.get(cause) ?? [0, cause.step];
    shownEvents += 1 + symptoms.length + again;
    out.push({ cause, symptoms: shown, moreSymptoms: symptoms.length - shown.length, repeats: again, lastStep });
  }
  out.reverse();
  return { groups: out, hidden: events.length - shownEvents };
}

export interface FeedView {
  readonly el: HTMLElement;
  /** Show `snap`; `pick` (what the user last clicked) decides the highlighted row. */
  update(snap: Snapshot, pick: Clicked | null): void;
}

export interface FeedOptions {
  /** A click (or Enter) on the first-failure box or a feed row. */
  onSelect(pick: Clicked): void;
}

function span(className: string, text: string): HTMLSpanElement {
  const s = document.createElement("span");
  s.className = className;
  s.textContent = text;
  return s;
}

function eventRow(ev: PanelEvent, symptom: boolean, snap: Snapshot, picked: ReadonlySet<number>): HTMLElement {
  const row = document.createElement("div");
  row.className = `ndbg-event ${symptom ? "ndbg-symptom" : "ndbg-cause"} ndbg-sev-${ev.severity}`;
  if (snap.firstFailure?.id === ev.id) row.classList.add("ndbg-is-first");
  if (picked.has(ev.id)) row.classList.add("ndbg-selected");
  row.dataset.id = String(ev.id);
  row.dataset.step = String(ev.step);
  if (ev.layer !== null) row.dataset.layer = ev.layer;
  row.tabIndex = 0;
  row.setAttribute("role", "button");
  row.title = `${ev.layer ?? "data / loss"} \u00b7 step ${ev.step} \u00b7 click to inspect`;
  row.append(
    span("ndbg-sev-dot", ""),
    span("ndbg-event-step", String(ev.step)),
    span("ndbg-event-kind", ev.kind),
    span("ndbg-event-message", ev.message),
  );
  return row;
}

export function createFeed(parent: HTMLElement, options: FeedOptions): FeedView {
  const first = document.createElement("div");
  first.className = "ndbg-first-failure";
  first.hidden = true;
  first.tabIndex = 0;
  first.setAttribute("role", "button");
  const firstLabel = span("ndbg-first-failure-label", "first failure");
  const firstText = span("ndbg-first-failure-message", "");
  const firstCauses = document.createElement("div");
  firstCauses.className = "ndbg-first-failure-causes";
  firstCauses.hidden = true;
  first.append(firstLabel, firstText, firstCauses);
  let shownCauses = "";

  const feed = document.createElement("div");
  feed.className = "ndbg-feed";
  feed.setAttribute("role", "list");
  parent.append(first, feed);

  let snap: Snapshot | null = null;
  let pick: Clicked | null = null;
  let shownFirst: FirstFailure | null = null;
  let cap = FEED_CAP;
  /** Causes whose "+N more symptoms" was clicked. */
  const expanded = new Set<number>();
  /** The first failure's row was brought into view for this run's end (once per end). */
  let revealed = false;
  let byId = new Map<number, PanelEvent>();

  function select(ev: FirstFailure, where: "first" | "feed"): void {
    options.onSelect(eventPick(ev, where));
  }

  function render(): void {
    if (!snap) return;
    const s = snap;
    shownFirst = s.firstFailure;
    first.hidden = shownFirst === null;
    if (shownFirst) {
      first.className = `ndbg-first-failure ndbg-sev-${shownFirst.severity}`;
      first.classList.toggle("ndbg-selected", firstPicked(shownFirst, pick, s.selected));
      first.dataset.id = String(shownFirst.id);
      first.dataset.step = String(shownFirst.step);
      firstText.textContent = shownFirst.message;
      first.title = "click to inspect";
    }
    const causes = shownFirst ? s.likelyCauses : [];
    const joined = causes.join("\n");
    if (joined !== shownCauses) {
      shownCauses = joined;
      firstCauses.replaceChildren(...causes.map((text) => span("ndbg-likely-cause", text)));
      firstCauses.hidden = causes.length === 0;
    }

    byId = new Map(s.events.map((ev) => [ev.id, ev]));
    const picked = pickedIds(s.events, pick, s.selected);
    const atBottom = feed.scrollHeight - feed.scrollTop - feed.clientHeight < 8;
    const layout = buildFeed(s.events, cap, SYMPTOM_CAP, expanded);
    const nodes: HTMLElement[] = [];
    if (layout.hidden > 0) {
      const more = document.createElement("button");
      more.type = "button";
      more.className = "ndbg-feed-more";
      more.textContent = `${layout.hidden} more earlier event${layout.hidden === 1 ? "" : "s"} (show)`;
      nodes.push(more);
    }
    for (const g of layout.groups) {
      const group = document.createElement("div");
      group.className = "ndbg-group";
      group.setAttribute("role", "listitem");
      const head = eventRow(g.cause, false, s, picked);
      if (g.repeats > 0) {
        head.classList.add("ndbg-flicker");
        head.appendChild(span("ndbg-event-repeats", `on and off ${g.repeats + 1}\u00d7 until step ${g.lastStep}`));
        head.title = `${head.title}; the same warning came and went ${g.repeats} more time(s), to step ${g.lastStep}: a value hovering at its threshold`;
      }
      group.appendChild(head);
      if (g.symptoms.length) {
        const list = document.createElement("div");
        list.className = "ndbg-symptoms";
        for (const ev of g.symptoms) list.appendChild(eventRow(ev, true, s, picked));
        if (g.moreSymptoms > 0) {
          const more = document.createElement("button");
          more.type = "button";
          more.className = "ndbg-symptoms-more";
          more.dataset.cause = String(g.cause.id);
          more.textContent = `+${g.moreSymptoms} more symptom${g.moreSymptoms === 1 ? "" : "s"} (show)`;
          list.appendChild(more);
        }
        group.appendChild(list);
      }
      nodes.push(group);
    }
    if (s.events.length === 0) {
      const text =
        s.status === "training"
          ? "no events yet"
          : watchedNothing(s)
            ? "no events: nothing was watched (see the note above)"
            : "no events: every layer stayed healthy";
      nodes.push(span("ndbg-feed-empty", text));
    }
    feed.replaceChildren(...nodes);
    if (s.status === "training") {
      revealed = false;
      if (atBottom) feed.scrollTop = feed.scrollHeight;
    } else if (!revealed && s.firstFailure) {
      revealed = true;
      reveal(s.firstFailure.id);
    } else if (atBottom) {
      feed.scrollTop = feed.scrollHeight;
    }
  }

  /** Scroll the feed (only the feed, not the page) so event `id`'s row is in view. */
  function reveal(id: number): void {
    const row = feed.querySelector<HTMLElement>(`.ndbg-event[data-id="${id}"]`);
    if (!row) return;
    const top = row.getBoundingClientRect().top - feed.getBoundingClientRect().top + feed.scrollTop;
    feed.scrollTop = Math.max(0, top - 4);
  }

  function eventOf(target: EventTarget | null): PanelEvent | null {
    const row = target instanceof Element ? target.closest<HTMLElement>(".ndbg-event") : null;
    return row ? (byId.get(Number(row.dataset.id)) ?? null) : null;
  }

  feed.addEventListener("click", (e) => {
    const moreSymptoms = e.target instanceof Element ? e.target.closest<HTMLElement>(".ndbg-symptoms-more") : null;
    if (moreSymptoms) {
      expanded.add(Number(moreSymptoms.dataset.cause));
      render();
      return;
    }
    if (e.target instanceof Element && e.target.closest(".ndbg-feed-more")) {
      cap += FEED_CAP;
      render();
      return;
    }
    const ev = eventOf(e.target);
    if (ev) select(ev, "feed");
  });
  feed.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" && e.key !== " ") return;
    const ev = eventOf(e.target);
    if (!ev) return;
    e.preventDefault();
    select(ev, "feed");
  });
  first.addEventListener("click", () => {
    if (shownFirst) select(shownFirst, "first");
  });
  first.addEventListener("keydown", (e) => {
    if ((e.key === "Enter" || e.key === " ") && shownFirst) {
      e.preventDefault();
      select(shownFirst, "first");
    }
  });

  return {
    el: feed,
    update(next, nextPick) {
      snap = next;
      pick = nextPick;
      render();
    },
  };
}
