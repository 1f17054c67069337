package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// series is one line of a chart: points (x seconds, y value) drawn as one
// polyline per segment.
type series struct {
	name     string
	color    string
	dashed   bool
	segments [][][2]float64
}

var kindColor = map[string]string{"baseline": "#1f77b4", "intake": "#ff7f0e", "replay": "#2ca02c"}

// chartHTML draws the result as one self-contained HTML page: inline SVG,
// no script, no external resources. The runs are laid end to end on one
// time axis.
func chartHTML(res *Result) []byte {
	var b strings.Builder
	b.WriteString("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>orderpipe bench " + html.EscapeString(res.Action) + "</title>\n")
	b.WriteString("<style>body{font-family:sans-serif;margin:2em;color:#222}svg{background:#fff;border:1px solid #ddd;margin:1em 0}td,th{padding:2px 10px;text-align:right}th{background:#eee}</style></head><body>\n")
	fmt.Fprintf(&b, "<h1>orderpipe bench %s</h1>\n<p>started %s, %d CPUs, %s; concurrency %d, duration %s</p>\n",
		html.EscapeString(res.Action), res.Started.Format("2006-01-02 15:04:05 MST"), res.Machine.NumCPU, html.EscapeString(res.Machine.GoVersion),
		res.Settings.Concurrency, res.Settings.Duration)

	b.WriteString("<table><tr><th>run</th><th>requests</th><th>ok/s</th><th>non-2xx</th><th>duplicates</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>max ms</th></tr>\n")
	for _, r := range res.Runs {
		name := r.Kind
		if r.Round > 0 {
			name = fmt.Sprintf("%s #%d", r.Kind, r.Round)
		}
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%d</td><td>%.1f</td><td>%d</td><td>%d</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td></tr>\n",
			html.EscapeString(name), r.Requests, r.Throughput, r.Non2xx, r.Duplicates, r.Latency.P50, r.Latency.P95, r.Latency.P99, r.Latency.Max)
	}
	b.WriteString("</table>\n")
	if c := res.Compare; c != nil {
		fmt.Fprintf(&b, "<p><b>compare</b>, medians of %d rounds: baseline %.1f/s, intake %.1f/s, ratio <b>%.3f×</b></p>\n", c.Rounds, c.BaselineMedian, c.IntakeMedian, c.Ratio)
	}
	if len(res.Failures) > 0 {
		b.WriteString("<p style=\"color:#b00\"><b>FAILED</b>: " + html.EscapeString(strings.Join(res.Failures, "; ")) + "</p>\n")
	}

	thr := map[string]*series{}
	p50 := map[string]*series{}
	p99 := map[string]*series{}
	var order []string
	offset := 0.0
	for _, r := range res.Runs {
		if thr[r.Kind] == nil {
			order = append(order, r.Kind)
			c := kindColor[r.Kind]
			thr[r.Kind] = &series{name: r.Kind + " ok/s", color: c}
			p50[r.Kind] = &series{name: r.Kind + " p50", color: c}
			p99[r.Kind] = &series{name: r.Kind + " p99", color: c, dashed: true}
		}
		var t, l5, l9 [][2]float64
		for _, s := range r.Timeline {
			x := offset + float64(s.T) + 0.5
			t = append(t, [2]float64{x, float64(s.OK)})
			l5 = append(l5, [2]float64{x, s.P50})
			l9 = append(l9, [2]float64{x, s.P99})
		}
		thr[r.Kind].segments = append(thr[r.Kind].segments, t)
		p50[r.Kind].segments = append(p50[r.Kind].segments, l5)
		p99[r.Kind].segments = append(p99[r.Kind].segments, l9)
		offset += float64(len(r.Timeline)) + 1
	}
	var ts, ls []series
	for _, k := range order {
		ts = append(ts, *thr[k])
		ls = append(ls, *p50[k], *p99[k])
	}
	b.WriteString(svgChart("Throughput (successful requests per second)", "per second", ts))
	b.WriteString(svgChart("Latency per second (p50 solid, p99 dashed)", "ms", ls))
	if e := res.E2E; e != nil && len(e.Timeline) > 0 {
		acc := series{name: "accepted/s", color: kindColor["intake"]}
		fin := series{name: "terminal/s", color: "#9467bd"}
		var a, f [][2]float64
		for _, s := range e.Timeline {
			a = append(a, [2]float64{float64(s.T) + 0.5, float64(s.Accepted)})
			f = append(f, [2]float64{float64(s.T) + 0.5, float64(s.Terminal)})
		}
		acc.segments, fin.segments = [][][2]float64{a}, [][][2]float64{f}
		b.WriteString(svgChart(fmt.Sprintf("End to end: accepted and terminal orders per second (completion %.1f/s)", e.CompletionRate), "per second", []series{acc, fin}))
	}
	b.WriteString("</body></html>\n")
	return []byte(b.String())
}

// svgChart is a line chart of ss with time (s) on x.
func svgChart(title, unit string, ss []series) string {
	const w, h, left, right, top, bottom = 900.0, 300.0, 70.0, 20.0, 30.0, 40.0
	xMax, yMax := 1.0, 1.0
	for _, s := range ss {
		for _, seg := range s.segments {
			for _, p := range seg {
				xMax, yMax = math.Max(xMax, p[0]), math.Max(yMax, p[1])
			}
		}
	}
	yMax = niceCeil(yMax)
	sx := func(x float64) float64 { return left + x/xMax*(w-left-right) }
	sy := func(y float64) float64 { return h - bottom - y/yMax*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, "<h2>%s</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" font-size=\"11\">\n", html.EscapeString(title), w, h, w, h)
	for i := 0; i <= 4; i++ {
		y := yMax * float64(i) / 4
		fmt.Fprintf(&b, "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
			left, w-right, sy(y), sy(y), left-5, sy(y)+4, trimFloat(y))
	}
	for i := 0; i <= 10; i++ {
		x := xMax * float64(i) / 10
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%.0fs</text>\n", sx(x), h-bottom+15, x)
	}
	fmt.Fprintf(&b, "<text x=\"12\" y=\"%g\" transform=\"rotate(-90 12 %g)\" text-anchor=\"middle\">%s</text>\n", h/2, h/2, html.EscapeString(unit))
	fmt.Fprintf(&b, "<line x1=\"%g\" x2=\"%g\" y1=\"%g\" y2=\"%g\" stroke=\"#888\"/>\n", left, w-right, h-bottom, h-bottom)
	for i, s := range ss {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="5,3"`
		}
		for _, seg := range s.segments {
			var pts []string
			for _, p := range seg {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(p[0]), sy(p[1])))
			}
			fmt.Fprintf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"%s\"/>\n", s.color, dash, strings.Join(pts, " "))
		}
		fmt.Fprintf(&b, "<line x1=\"%g\" x2=\"%g\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/><text x=\"%g\" y=\"%d\">%s</text>\n",
			left+10+float64(i)*140, left+35+float64(i)*140, 14, 14, s.color, dash, left+40+float64(i)*140, 18, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}
