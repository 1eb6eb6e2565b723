package simulator

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotPoints bounds the points drawn per strategy; the tail keeps every rank
// above the 99th percentile so its steps stay visible.
const plotPoints = 2000

// WritePlot draws every strategy's latency CDF on a log-scale time axis and
// writes it to path; the format follows the file extension (.png, .svg, .pdf).
func (rep *Report) WritePlot(path string) error {
	p := plot.New()
	mode := "complete answer"
	if rep.Stream {
		mode = "first committed token"
	}
	p.Title.Text = fmt.Sprintf("%s, %d requests, seed %d: latency to the %s", rep.Workload, rep.Requests, rep.Seed, mode)
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of groups"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	for i, s := range rep.Strategies {
		pts := cdfPoints(s.Latencies)
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		if s.Name == StrategyHedgerow {
			line.Width = vg.Points(2.5)
			line.Color = color.RGBA{R: 0x1b, G: 0x7f, B: 0x3b, A: 0xff}
		}
		p.Add(line)
		p.Legend.Add(s.Name, line)
	}
	if err := p.Save(10*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

// cdfPoints samples the empirical CDF of sorted latencies: evenly in rank
// below the 99th percentile, every rank above it.
func cdfPoints(sorted []float64) plotter.XYs {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	tailFrom := int(0.99 * float64(n))
	step := max(1, tailFrom/plotPoints)
	pts := make(plotter.XYs, 0, plotPoints+n-tailFrom+1)
	add := func(i int) {
		x := math.Max(sorted[i], 1) // log axis: nothing below 1 ms
		pts = append(pts, plotter.XY{X: x, Y: float64(i+1) / float64(n)})
	}
	for i := 0; i < tailFrom; i += step {
		add(i)
	}
	for i := tailFrom; i < n; i++ {
		add(i)
	}
	return pts
}
