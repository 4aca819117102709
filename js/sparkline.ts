/**
 * The loss sparkline: an inline SVG polyline, broken where the loss is missing or
 * non-finite (NaN in the trait), with a red mark at each such point. Log scale when the
 * loss is positive and spans more than three decades (a divergence would flatten the rest).
 */
const SVG = "http://www.w3.org/2000/svg";

export interface SparklineGeometry {
  /** Polyline `points` attributes, one per run of finite values. */
  segments: string[];
  /** x of each missing / non-finite point. */
  gaps: number[];
  scale: "linear" | "log";
  min: number;
  max: number;
  /** Last finite value, NaN if none. */
  last: number;
}

export function sparklineGeometry(values: ArrayLike<number>, width: number, height: number, pad = 2): SparklineGeometry {
  const n = values.length;
  let min = Infinity;
  let max = -Infinity;
  let last = Number.NaN;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (!Number.isFinite(v)) continue;
    if (v < min) min = v;
    if (v > max) max = v;
    last = v;
  }
  const scale = min > 0 && max / min > 1e3 ? "log" : "linear";
  const f = scale === "log" ? Math.log10 : (v: number): number => v;
  const lo = Number.isFinite(min) ? f(min) : 0;
  const hi = Number.isFinite(max) ? f(max) : 1;
  const span = hi - lo || 1;
  const x = (i: number): number => (n <= 1 ? width / 2 : pad + (i * (width - 2 * pad)) / (n - 1));
  const y = (v: number): number => (hi === lo ? height / 2 : height - pad - ((f(v) - lo) * (height - 2 * pad)) / span);
  const round = (v: number): string => String(Math.round(v * 10) / 10);

  const segments: string[] = [];
  const gaps: number[] = [];
  let current: string[] = [];
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (Number.isFinite(v)) {
      current.push(`${round(x(i))},${round(y(v))}`);
    } else {
      gaps.push(Math.round(x(i) * 10) / 10);
      if (current.length) segments.push(current.join(" "));
      current = [];
    }
  }
  if (current.length) segments.push(current.join(" "));
  return { segments, gaps, scale, min, max, last };
}

export interface SparklineView {
  readonly el: SVGSVGElement;
  update(values: ArrayLike<number>): SparklineGeometry;
}

export function createSparkline(parent: HTMLElement, width = 160, height = 28): SparklineView {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "ndbg-sparkline");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  parent.appendChild(svg);

  return {
    el: svg,
    update(values) {
      const g = sparklineGeometry(values, width, height);
      const nodes: SVGElement[] = [];
      for (const points of g.segments) {
        const count = points.split(" ").length;
        if (count === 1) {
          const [cx = "0", cy = "0"] = points.split(",");
          const dot = document.createElementNS(SVG, "circle");
          dot.setAttribute("class", "ndbg-sparkline-dot");
          dot.setAttribute("cx", cx);
          dot.setAttribute("cy", cy);
          dot.setAttribute("r", "1.5");
          nodes.push(dot);
          continue;
        }
        const line = document.createElementNS(SVG, "polyline");
        line.setAttribute("class", "ndbg-sparkline-line");
        line.setAttribute("points", points);
        nodes.push(line);
      }
      for (const gx of g.gaps) {
        const mark = document.createElementNS(SVG, "rect");
        mark.setAttribute("class", "ndbg-sparkline-nan");
        // A red tick along the bottom; a run of missing points reads as a red band.
        mark.setAttribute("x", String(gx - 0.75));
        mark.setAttribute("y", String(height * 0.6));
        mark.setAttribute("width", "1.5");
        mark.setAttribute("height", String(height * 0.4));
        nodes.push(mark);
      }
      svg.replaceChildren(...nodes);
      const title = document.createElementNS(SVG, "title");
      title.textContent = values.length
        ? `loss (${g.scale} scale), ${g.gaps.length} non-finite point(s)`
        : "no loss recorded yet";
      svg.prepend(title);
      return g;
    },
  };
}
