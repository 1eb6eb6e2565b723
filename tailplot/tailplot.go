// Package tailplot draws latency tail plots: for each series the share of
// requests slower than each latency (the complementary CDF), both axes on
// log scales, so P99 and P99.9 sit a decade apart and their differences
// show, where a linear CDF squeezes the whole tail into its top pixel.
// Each tail is drawn as the staircase it is — a sample of 69 shows its 69
// steps, not straight lines between them — and the legend, with each
// series' sample size, sits in a column of its own beside the axes, never
// over the data (Save, which the simulator's frontier plot uses too).
// `hedgerow simulate --plot` and `hedgerow report --plot` both draw with it.
package tailplot

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Series is one curve: a name for the legend and latencies in ms, sorted
// ascending.
type Series struct {
	Name      string
	Latencies []float64
	// Emphasis draws it thicker (the strategy or arm the plot is about).
	Emphasis bool
	// Dashed draws the line dashed (a control arm beside its hedged arm).
	Dashed bool
	// Band draws the series as a wide pale grey band beneath every line,
	// in no colour of the palette, so a line equal to it (a total that one
	// cohort makes up nearly alone) still shows on top of it, and the band
	// around that line.
	Band bool
}

// Palette holds distinct colours (Okabe and Ito's, told apart with any
// colour vision), used in order; a colour past its end reuses them with a
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

// The bands' greys, beneath every line: a solid band and a dashed one.
var (
	bandGrey      = color.Gray{Y: 0xcc}
	bandGreyLight = color.Gray{Y: 0xdd}
)

// maxBodyPoints bounds the ranks drawn below the 90th percentile of a
// series; every rank above it is drawn, so the tail keeps its steps.
const maxBodyPoints = 1000

// Width and Height are the size of the plots Write draws, before the
// legend's column widens them.
const (
	Width  = 10 * vg.Inch
	Height = 6 * vg.Inch
)

// ErrNoData is returned when no series has a latency.
var ErrNoData = errors.New("tailplot: no latencies to plot")

// Write draws series under title and writes the plot to path; the format
// follows the extension (.png, .svg, .pdf). Horizontal guides mark P99
// (1% slower) and P99.9 (0.1% slower).
func Write(path, title string, series []Series) error {
	p, err := New(title, series)
	if err != nil {
		return err
	}
	_, err = Save(p, Width, Height, path, nil)
	return err
}

// New builds the tail plot of series: bands first, beneath every line,
// then the lines in order, each series in the legend with its sample size.
func New(title string, series []Series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "share of requests slower (log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = Ticks125{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())

	type drawn struct {
		line   *plotter.Line
		end    *plotter.Scatter // nil for a band
		legend string
	}
	var bands, lines []drawn
	xmin, xmax, ymin := math.Inf(1), 0.0, 1.0
	c := 0 // the next line's colour
	for _, s := range series {
		pts := Points(s.Latencies)
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("tailplot: %s: %w", s.Name, err)
		}
		line.Color = Palette[c%len(Palette)]
		line.Width = vg.Points(1.5)
		if s.Emphasis {
			line.Width = vg.Points(2.5)
		}
		if s.Dashed || c >= len(Palette) {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		d := drawn{line: line, legend: fmt.Sprintf("%s (n=%d)", s.Name, len(s.Latencies))}
		if !s.Band {
			// A dot where the tail ends (its slowest value, at 1/n): a
			// series of one value is that dot alone.
			end, err := plotter.NewScatter(pts[len(pts)-1:])
			if err != nil {
				return nil, fmt.Errorf("tailplot: %s: %w", s.Name, err)
			}
			end.Color, end.Radius, end.Shape = line.Color, vg.Points(3), draw.CircleGlyph{}
			d.end = end
		}
		if s.Band {
			line.Color, line.Width = bandGrey, vg.Points(9)
			if s.Dashed {
				line.Color, line.Dashes = bandGreyLight, []vg.Length{vg.Points(10), vg.Points(4)}
			}
			bands = append(bands, d)
		} else {
			lines = append(lines, d)
			c++
		}
		xmin, xmax = math.Min(xmin, pts[0].X), math.Max(xmax, pts[len(pts)-1].X)
		ymin = math.Min(ymin, pts[len(pts)-1].Y)
	}
	if len(bands)+len(lines) == 0 {
		return nil, ErrNoData
	}
	for _, d := range append(lines, bands...) {
		p.Legend.Add(d.legend, d.line)
	}
	for _, d := range append(bands, lines...) {
		p.Add(d.line)
		if d.end != nil {
			p.Add(d.end)
		}
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
			return nil, fmt.Errorf("tailplot: %s guide: %w", g.name, err)
		}
		guide.Color = color.Gray{Y: 0x80}
		guide.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		label, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: xmin, Y: g.share}}, Labels: []string{g.name}})
		if err != nil {
			return nil, fmt.Errorf("tailplot: %s label: %w", g.name, err)
		}
		label.TextStyle[0].YAlign = draw.YBottom
		p.Add(guide, label)
	}
	return p, nil
}

// Points is the tail curve of sorted latencies as the staircase it is:
// the share of values at or above each latency, from 1 down to 1/n,
// dropping at each value and level between two, so that every segment is
// horizontal or vertical. Below the 90th percentile ranks are sampled
// evenly (the staircase there steps once per sampled rank); above it
// every rank is kept. Latencies under 1 ms are drawn at 1 ms (the axis is
// logarithmic).
func Points(sorted []float64) plotter.XYs {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	tailFrom := int(0.9 * float64(n))
	step := max(1, tailFrom/maxBodyPoints)
	pts := make(plotter.XYs, 0, 2*(maxBodyPoints+n-tailFrom+1))
	add := func(i int) {
		x, y := math.Max(sorted[i], 1), float64(n-i)/float64(n)
		if len(pts) > 0 {
			// The drop at the previous latency, to this one's level, which
			// holds up to this latency: between two neighbouring values
			// the share at or above is the upper one's.
			pts = append(pts, plotter.XY{X: pts[len(pts)-1].X, Y: y})
		}
		pts = append(pts, plotter.XY{X: x, Y: y})
	}
	for i := 0; i < tailFrom; i += step {
		add(i)
	}
	for i := tailFrom; i < n; i++ {
		add(i)
	}
	return pts
}

// Layout is where Save put a plot's parts, in the canvas's units.
type Layout struct {
	// Canvas is the whole image; Data the axes' data area.
	Canvas, Data vg.Rectangle
	// Legend is the legend's entries, in a column right of the axes.
	Legend vg.Rectangle
	// Overlay is what the overlay function drew (the frontier's labels).
	Overlay []vg.Rectangle
}

// legendGap separates the axes from the legend's column, and the column
// from the image's right edge.
const legendGap = 12 // points

// Save draws p at width × height with its legend moved out of the data
// area into a column of its own to the right (the image widens by it),
// then calls overlay, when not nil, with the plot and its data canvas to
// draw on top (and report the boxes it drew), and writes the image to path
// in the format of its extension (.png, .svg, .pdf).
func Save(p *plot.Plot, width, height vg.Length, path string, overlay func(p *plot.Plot, data draw.Canvas) []vg.Rectangle) (Layout, error) {
	legend := p.Legend
	legend.Top, legend.Left = true, true
	size := legend.Rectangle(draw.Canvas{}).Size()
	gap := vg.Points(legendGap)
	column := size.X + 2*gap

	// gonum centres the y axis's label at the linear middle of its range,
	// which on a log axis is near its top, and pads the data area down by
	// half the label's length: the label is drawn here instead, centred
	// on the data area, in a strip of its own.
	yLabel := p.Y.Label.TextStyle
	yLabel.Rotation += math.Pi / 2
	yLabel.XAlign, yLabel.YAlign = draw.XCenter, draw.YCenter
	yText := p.Y.Label.Text
	strip := vg.Length(0)
	if yText != "" {
		strip = p.Y.Label.TextStyle.Height(yText) + p.Y.Label.Padding
	}

	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	c, err := draw.NewFormattedCanvas(width+column, height, format)
	if err != nil {
		return Layout{}, fmt.Errorf("tailplot: %s: %w", path, err)
	}
	dc := draw.New(c)
	plotC := draw.Crop(dc, strip, -column, 0, 0)
	p.Legend = plot.NewLegend() // drawn below, outside the data area
	p.Y.Label.Text = ""
	p.Draw(plotC)
	data := p.DataCanvas(plotC)
	p.Legend, p.Y.Label.Text = legend, yText
	if yText != "" {
		dc.FillText(yLabel, vg.Point{X: dc.Min.X + strip/2, Y: (data.Min.Y + data.Max.Y) / 2}, yText)
	}
	legendC := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: plotC.Max.X + gap, Y: data.Min.Y},
		Max: vg.Point{X: plotC.Max.X + gap + size.X, Y: data.Max.Y},
	}}
	legend.Draw(legendC)
	layout := Layout{
		Canvas: dc.Rectangle,
		Data:   data.Rectangle,
		Legend: vg.Rectangle{Min: vg.Point{X: legendC.Min.X, Y: legendC.Max.Y - size.Y}, Max: legendC.Max},
	}
	if overlay != nil {
		layout.Overlay = overlay(p, data)
	}

	f, err := os.Create(path)
	if err != nil {
		return Layout{}, fmt.Errorf("tailplot: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		_ = f.Close()
		return Layout{}, fmt.Errorf("tailplot: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return Layout{}, fmt.Errorf("tailplot: write %s: %w", path, err)
	}
	return layout, nil
}

// Overlaps reports whether two rectangles share more than an edge.
func Overlaps(a, b vg.Rectangle) bool {
	return a.Min.X < b.Max.X && b.Min.X < a.Max.X && a.Min.Y < b.Max.Y && b.Min.Y < a.Max.Y
}

// Ticks125 marks a logarithmic axis at 1, 2 and 5 times each power of ten,
// labelled, with unlabelled ticks between: a latency axis spans a decade
// or two, where ticks at the powers alone would label one value.
type Ticks125 struct{}

// Ticks returns the ticks between lo and hi.
func (Ticks125) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi >= lo) || math.IsInf(hi, 0) {
		return nil
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		decade := math.Pow(10, e)
		for m := 1; m <= 9; m++ {
			v := float64(m) * decade
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
