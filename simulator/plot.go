package simulator

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/hedgerow/hedgerow/tailplot"
)

// WritePlot draws every strategy's latency tail (share of groups slower
// than each latency, both axes logarithmic: tailplot) and writes it to
// path; the format follows the file extension (.png, .svg, .pdf).
func (rep *Report) WritePlot(path string) error {
	mode := "complete answer"
	if rep.Stream {
		mode = "first committed token"
	}
	series := make([]tailplot.Series, 0, len(rep.Strategies))
	for _, s := range rep.Strategies {
		series = append(series, tailplot.Series{Name: s.Name, Latencies: s.Latencies, Emphasis: s.Name == StrategyHedgerow})
	}
	title := fmt.Sprintf("%s, %d requests, seed %d: latency to the %s", rep.Workload, rep.Requests, rep.Seed, mode)
	if err := tailplot.Write(path, title, series); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

// WritePlot draws the frontier: P99 and P99.9 against the duplicate rate,
// one point per setting labelled with its delay quantile, the duplicate
// ceiling as a vertical line and the recommended setting ringed. The format
// follows the file extension (.png, .svg, .pdf).
func (f *Frontier) WritePlot(path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("delay frontier of %s, seed %d", f.Source, f.Seed)
	p.X.Label.Text = "duplicate rate (extra attempts per group)"
	p.Y.Label.Text = "latency (ms, log scale)"
	// Log scale: a setting that leaves hangs unhedged sits at the deadline,
	// an order of magnitude above the rest.
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.DefaultTicks{} // log ticks label nothing within a decade
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	points := sortedByDuplicates(f.Frontier)
	for i, series := range []struct {
		name string
		y    func(FrontierPoint) float64
	}{
		{"P99", func(pt FrontierPoint) float64 { return pt.P99 }},
		{"P99.9", func(pt FrontierPoint) float64 { return pt.P999 }},
	} {
		xys := make(plotter.XYs, len(points))
		labels := make([]string, len(points))
		for j, pt := range points {
			xys[j] = plotter.XY{X: pt.DuplicateRate, Y: math.Max(series.y(pt), 1)} // log axis: nothing below 1 ms
			labels[j] = fmt.Sprintf("q%g", pt.Quantile)
		}
		line, scatter, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", series.name, err)
		}
		line.Color, scatter.Color = plotutil.Color(i), plotutil.Color(i)
		line.Width = vg.Points(1.5)
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
		if err != nil {
			return fmt.Errorf("plot %s labels: %w", series.name, err)
		}
		p.Add(line, scatter, lbl)
		p.Legend.Add(series.name, line, scatter)
	}
	if c := f.Ceilings.DuplicateRate; c > 0 && !math.IsInf(c, 0) {
		ymin, ymax := math.Inf(1), 1.0
		for _, pt := range points {
			ymin, ymax = math.Min(ymin, math.Max(pt.P99, 1)), math.Max(ymax, pt.P999)
		}
		ceiling, err := plotter.NewLine(plotter.XYs{{X: c, Y: ymin}, {X: c, Y: ymax}})
		if err != nil {
			return fmt.Errorf("plot ceiling: %w", err)
		}
		ceiling.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		ceiling.Color = color.Gray{Y: 0x60}
		p.Add(ceiling)
		p.Legend.Add("duplicate ceiling", ceiling)
	}
	if r := f.Recommended; r != nil {
		ring, err := plotter.NewScatter(plotter.XYs{{X: r.DuplicateRate, Y: r.P999}})
		if err != nil {
			return fmt.Errorf("plot recommendation: %w", err)
		}
		ring.Radius = vg.Points(7)
		ring.Color = color.RGBA{R: 0x1b, G: 0x7f, B: 0x3b, A: 0xff}
		p.Add(ring)
		p.Legend.Add("recommended", ring)
	}
	if err := p.Save(10*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}
