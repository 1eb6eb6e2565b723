// Package tailplot draws latency tail plots: for each series the share of
// requests slower than each latency (the complementary CDF), both axes on
// log scales, so P99 and P99.9 sit a decade apart and their differences
// show, where a linear CDF squeezes the whole tail into its top pixel.
// `hedgerow simulate --plot` and `hedgerow report --plot` both draw with it.
package tailplot

import (
	"errors"
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Series is one curve: a name for the legend and latencies in ms, sorted
// ascending. Emphasis draws it thicker (the strategy the plot is about).
type Series struct {
	Name      string
	Latencies []float64
	Emphasis  bool
}

// Palette holds distinct colours (Okabe and Ito's, told apart with any
// colour vision), used in order; a series past its end reuses them with a
// dashed line.
var Palette = []color.RGBA{
	{R: 0x00, G: 0x72, B: 0xb2, A: 0xff}, // blue
	{R: 0xd5, G: 0x5e, B: 0x00, A: 0xff}, // vermillion
	{R: 0x00, G: 0x9e, B: 0x73, A: 0xff}, // bluish green
	{R: 0xcc, G: 0x79, B: 0xa7, A: 0xff}, // reddish purple
	{R: 0xe6, G: 0x9f, B: 0x00, A: 0xff}, // orange
	{R: 0x00, G: 0x00, B: 0x00, A: 0xff}, // black
	{R: 0x56, G: 0xb4, B: 0xe9, A: 0xff}, // sky blue (after black: far from the first blue)
	{R: 0xf0, G: 0xe4, B: 0x42, A: 0xff}, // yellow
}

// maxBodyPoints bounds the points drawn below the 90th percentile of a
// series; every rank above it is drawn, so the tail keeps its steps.
const maxBodyPoints = 1000

// ErrNoData is returned when no series has a latency.
var ErrNoData = errors.New("tailplot: no latencies to plot")

// Write draws series under title and writes the plot to path; the format
// follows the extension (.png, .svg, .pdf). Horizontal guides mark P99
// (1% slower) and P99.9 (0.1% slower).
func Write(path, title string, series []Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "share of requests slower (log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	drawn, xmin, xmax, ymin := 0, math.Inf(1), 0.0, 1.0
	for i, s := range series {
		pts := Points(s.Latencies)
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("tailplot: %s: %w", s.Name, err)
		}
		line.Color = Palette[i%len(Palette)]
		line.Width = vg.Points(1.5)
		if i >= len(Palette) {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		if s.Emphasis {
			line.Width = vg.Points(2.5)
		}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("%s (n=%d)", s.Name, len(s.Latencies)), line)
		drawn++
		xmin, xmax = math.Min(xmin, pts[0].X), math.Max(xmax, pts[len(pts)-1].X)
		ymin = math.Min(ymin, pts[len(pts)-1].Y)
	}
	if drawn == 0 {
		return ErrNoData
	}
	for _, g := range []struct {
		name  string
		share float64
	}{{"P99", 0.01}, {"P99.9", 0.001}} {
		if g.share < ymin {
			continue // no series reaches that far into the tail
		}
		guide, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: g.share}, {X: xmax, Y: g.share}})
		if err != nil {
			return fmt.Errorf("tailplot: %s guide: %w", g.name, err)
		}
		guide.Color = color.Gray{Y: 0x80}
		guide.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		label, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: xmin, Y: g.share}}, Labels: []string{g.name}})
		if err != nil {
			return fmt.Errorf("tailplot: %s label: %w", g.name, err)
		}
		label.TextStyle[0].YAlign = draw.YBottom
		p.Add(guide, label)
	}
	if err := p.Save(10*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("tailplot: write %s: %w", path, err)
	}
	return nil
}

// Points is the tail curve of sorted latencies: at each latency, the share
// of values at or above it, from 1 down to 1/n. Below the 90th percentile
// ranks are sampled evenly; above it every rank is kept. Latencies under 1
// ms are drawn at 1 ms (the axis is logarithmic).
func Points(sorted []float64) plotter.XYs {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	tailFrom := int(0.9 * float64(n))
	step := max(1, tailFrom/maxBodyPoints)
	pts := make(plotter.XYs, 0, maxBodyPoints+n-tailFrom+1)
	add := func(i int) {
		pts = append(pts, plotter.XY{X: math.Max(sorted[i], 1), Y: float64(n-i) / float64(n)})
	}
	for i := 0; i < tailFrom; i += step {
		add(i)
	}
	for i := tailFrom; i < n; i++ {
		add(i)
	}
	return pts
}
