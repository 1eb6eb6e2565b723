package simulator

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/hedgerow/hedgerow/tailplot"
)

// The frontier plot's colours: tailplot's palette for its two quantiles,
// the recommendation in green, dominated settings faded.
var (
	p999Colour  = tailplot.Palette[0] // blue
	p99Colour   = tailplot.Palette[1] // vermillion
	recommended = color.RGBA{R: 0x1b, G: 0x7f, B: 0x3b, A: 0xff}
	fadedText   = color.Gray{Y: 0x99}
)

// fade is c at 40% opacity (alpha-premultiplied): a dominated setting.
func fade(c color.RGBA) color.RGBA {
	const keep = 0.4
	return color.RGBA{R: uint8(keep * float64(c.R)), G: uint8(keep * float64(c.G)), B: uint8(keep * float64(c.B)), A: uint8(keep * 0xff)}
}

// frontierMetric is one of the two tail quantiles the frontier plot draws
// against the duplicate rate.
type frontierMetric struct {
	name   string
	of     func(FrontierPoint) float64
	colour color.RGBA
	glyph  draw.GlyphDrawer
}

var frontierMetrics = []frontierMetric{
	{"P99.9", func(p FrontierPoint) float64 { return p.P999 }, p999Colour, draw.CircleGlyph{}},
	{"P99", func(p FrontierPoint) float64 { return p.P99 }, p99Colour, draw.TriangleGlyph{}},
}

// paretoFront splits points by one metric into its Pareto frontier — the
// settings no other setting beats, at most its duplicate rate and at most
// its metric with one of them less — in order of duplicate rate (so the
// metric falls along it), and the dominated rest, in the order given.
func paretoFront(points []FrontierPoint, metric func(FrontierPoint) float64) (front, dominated []FrontierPoint) {
	for i, p := range points {
		beaten := false
		for j, q := range points {
			if i != j && q.DuplicateRate <= p.DuplicateRate && metric(q) <= metric(p) &&
				(q.DuplicateRate < p.DuplicateRate || metric(q) < metric(p)) {
				beaten = true
				break
			}
		}
		if beaten {
			dominated = append(dominated, p)
		} else {
			front = append(front, p)
		}
	}
	slices.SortStableFunc(front, func(a, b FrontierPoint) int {
		if c := compareFloats(a.DuplicateRate, b.DuplicateRate); c != 0 {
			return c
		}
		return compareFloats(metric(b), metric(a))
	})
	return front, dominated
}

func compareFloats(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// frontierLabel is a text to place beside a point of the plot.
type frontierLabel struct {
	text   string
	at     plotter.XY
	colour color.Color
}

// frontierDrawing is the frontier plot before it is laid out: the plot,
// what each metric's frontier line joins and which points it fades, and
// the labels to place (in order of precedence: the recommendation, the
// frontiers' settings, the dominated ones).
type frontierDrawing struct {
	plot      *plot.Plot
	fronts    map[string]plotter.XYs
	dominated map[string]plotter.XYs
	labels    []frontierLabel
	// placed are the texts placeLabels drew (labels at one spot joined).
	placed []string
}

// settingName names a setting in a label: its delay quantile, and its
// duplicate ceiling when the sweep tried more than one.
func settingName(p FrontierPoint, ceilings bool) string {
	name := "q" + strconv.FormatFloat(p.Quantile, 'g', -1, 64)
	if ceilings {
		name += "/c" + strconv.FormatFloat(p.DuplicateCeiling, 'g', 3, 64)
	}
	return name
}

// drawing builds the frontier plot: for P99.9 and P99 against the
// duplicate rate, each metric's Pareto frontier joined by a line and its
// dominated settings faded, the duplicate ceiling as a vertical line and
// the recommended setting ringed.
func (f *Frontier) drawing() (*frontierDrawing, error) {
	if len(f.Frontier) == 0 {
		return nil, fmt.Errorf("plot: the frontier has no setting")
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("delay frontier of %s, seed %d", f.Source, f.Seed)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "duplicate rate (extra attempts per group)"
	p.Y.Label.Text = "latency (ms, log scale)"
	// Log scale: a setting that leaves hangs unhedged sits at the deadline,
	// an order of magnitude above the rest.
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = tailplot.Ticks125{}
	p.Add(plotter.NewGrid())

	ceilings := map[float64]bool{}
	for _, pt := range f.Frontier {
		ceilings[pt.DuplicateCeiling] = true
	}
	d := &frontierDrawing{plot: p, fronts: map[string]plotter.XYs{}, dominated: map[string]plotter.XYs{}}
	var frontLabels, fadedLabels []frontierLabel
	ymin, ymax, xmax := math.Inf(1), 1.0, 0.0
	xy := func(pt FrontierPoint, m frontierMetric) plotter.XY {
		return plotter.XY{X: pt.DuplicateRate, Y: math.Max(m.of(pt), 1)} // log axis: nothing below 1 ms
	}
	for _, m := range frontierMetrics {
		front, dominated := paretoFront(f.Frontier, m.of)
		for _, set := range []struct {
			points []FrontierPoint
			faded  bool
		}{{dominated, true}, {front, false}} {
			if len(set.points) == 0 {
				continue
			}
			xys := make(plotter.XYs, len(set.points))
			for i, pt := range set.points {
				xys[i] = xy(pt, m)
				ymin, ymax, xmax = math.Min(ymin, xys[i].Y), math.Max(ymax, xys[i].Y), math.Max(xmax, xys[i].X)
				if r := f.Recommended; r != nil && m.name == frontierMetrics[0].name &&
					pt.Quantile == r.Quantile && pt.DuplicateCeiling == r.DuplicateCeiling {
					continue // the recommendation's own label names it
				}
				l := frontierLabel{text: settingName(pt, len(ceilings) > 1), at: xys[i], colour: color.Black}
				if set.faded {
					l.colour = fadedText
					fadedLabels = append(fadedLabels, l)
				} else {
					frontLabels = append(frontLabels, l)
				}
			}
			// Settings that gave the same figures share one glyph (faded
			// glyphs drawn over each other would darken).
			var glyphs plotter.XYs
			for _, xy := range xys {
				if !slices.Contains(glyphs, xy) {
					glyphs = append(glyphs, xy)
				}
			}
			scatter, err := plotter.NewScatter(glyphs)
			if err != nil {
				return nil, fmt.Errorf("plot %s: %w", m.name, err)
			}
			scatter.Shape, scatter.Color, scatter.Radius = m.glyph, m.colour, vg.Points(3.5)
			if set.faded {
				d.dominated[m.name] = xys
				scatter.Color = fade(m.colour)
				p.Add(scatter)
				p.Legend.Add(m.name+", dominated setting", scatter)
				continue
			}
			d.fronts[m.name] = xys
			line, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("plot %s: %w", m.name, err)
			}
			line.Color, line.Width = m.colour, vg.Points(2)
			p.Add(line, scatter)
			p.Legend.Add(m.name+", Pareto frontier", line, scatter)
		}
	}
	if c := f.Ceilings.DuplicateRate; c > 0 && !math.IsInf(c, 0) {
		xmax = math.Max(xmax, c)
		ceiling, err := plotter.NewLine(plotter.XYs{{X: c, Y: ymin}, {X: c, Y: ymax}})
		if err != nil {
			return nil, fmt.Errorf("plot ceiling: %w", err)
		}
		ceiling.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		ceiling.Color = color.Gray{Y: 0x60}
		p.Add(ceiling)
		p.Legend.Add(fmt.Sprintf("duplicate ceiling %.3f", c), ceiling)
	}
	if r := f.Recommended; r != nil {
		var rings plotter.XYs
		for _, m := range frontierMetrics {
			rings = append(rings, xy(*r, m))
		}
		ring, err := plotter.NewScatter(rings)
		if err != nil {
			return nil, fmt.Errorf("plot recommendation: %w", err)
		}
		ring.Shape, ring.Radius, ring.Color = draw.RingGlyph{}, vg.Points(8), recommended
		p.Add(ring)
		p.Legend.Add(fmt.Sprintf("recommended: %s (P99.9 %.0f ms, P99 %.0f ms, %.3f duplicates)",
			settingName(*r, len(ceilings) > 1), r.P999, r.P99, r.DuplicateRate), ring)
		d.labels = append(d.labels, frontierLabel{text: "recommended " + settingName(*r, len(ceilings) > 1),
			at: xy(*r, frontierMetrics[0]), colour: recommended})
	}
	d.labels = append(append(d.labels, frontLabels...), fadedLabels...)
	// Room around the points for their labels: from no duplicates, and a
	// margin above and below on the log axis.
	p.X.Min, p.X.Max = 0, xmax*1.08
	p.Y.Min, p.Y.Max = ymin/1.25, ymax*1.25
	return d, nil
}

// WritePlot draws the frontier (drawing) with its legend beside the axes
// and every label placed where it covers no other label, no point and,
// where it can, no line; the format follows the file extension (.png,
// .svg, .pdf).
func (f *Frontier) WritePlot(path string) error {
	_, _, err := f.writePlot(path)
	return err
}

// writePlot is WritePlot returning the drawing and its layout, for the
// tests.
func (f *Frontier) writePlot(path string) (*frontierDrawing, tailplot.Layout, error) {
	d, err := f.drawing()
	if err != nil {
		return nil, tailplot.Layout{}, err
	}
	layout, err := tailplot.Save(d.plot, tailplot.Width, tailplot.Height, path, d.placeLabels)
	if err != nil {
		return nil, tailplot.Layout{}, fmt.Errorf("write plot %s: %w", path, err)
	}
	return d, layout, nil
}

// placeLabels draws d's labels on the data canvas and returns their boxes.
// Labels at one spot (settings that gave the same figures) become one
// label. Each is tried on every side of its point, near and then further
// out, inside the data area, and placed at the first spot that overlaps no
// placed label and no point — first among spots that also cross no
// frontier or ceiling line; a label with no such spot is left out
// (dominated settings' labels, placed last, first of all).
func (d *frontierDrawing) placeLabels(p *plot.Plot, c draw.Canvas) []vg.Rectangle {
	tx, ty := p.Transforms(&c)
	at := func(xy plotter.XY) vg.Point { return vg.Point{X: tx(xy.X), Y: ty(xy.Y)} }

	// Merge the labels at one spot (within a point), keeping the first's colour.
	type spot struct {
		texts  []string
		at     vg.Point
		colour color.Color
	}
	var spots []*spot
	for _, l := range d.labels {
		pt := at(l.at)
		var same *spot
		for _, s := range spots {
			if math.Abs(float64(s.at.X-pt.X)) < 1 && math.Abs(float64(s.at.Y-pt.Y)) < 1 && s.colour == l.colour {
				same = s
				break
			}
		}
		if same == nil {
			spots = append(spots, &spot{texts: []string{l.text}, at: pt, colour: l.colour})
		} else if !slices.Contains(same.texts, l.text) {
			same.texts = append(same.texts, l.text)
		}
	}

	const markerHalf = 5 // points: a glyph's half-width
	var obstacles []vg.Rectangle
	for _, xys := range []map[string]plotter.XYs{d.fronts, d.dominated} {
		for _, pts := range xys {
			for _, xy := range pts {
				pt := at(xy)
				obstacles = append(obstacles, vg.Rectangle{
					Min: vg.Point{X: pt.X - markerHalf, Y: pt.Y - markerHalf},
					Max: vg.Point{X: pt.X + markerHalf, Y: pt.Y + markerHalf}})
			}
		}
	}
	var segments [][2]vg.Point
	for _, pts := range d.fronts {
		for i := 1; i < len(pts); i++ {
			segments = append(segments, [2]vg.Point{at(pts[i-1]), at(pts[i])})
		}
	}

	sty := p.Legend.TextStyle
	sty.Font.Size = vg.Points(10)
	sty.XAlign, sty.YAlign = draw.XLeft, draw.YBottom
	var placed []vg.Rectangle
	for _, s := range spots {
		text := strings.Join(s.texts, " ")
		rect := sty.Rectangle(text)
		box, ok := placeLabel(s.at, rect.Size(), c.Rectangle, append(obstacles, placed...), segments)
		if !ok {
			continue
		}
		ts := sty
		ts.Color = s.colour
		c.FillText(ts, box.Min.Sub(rect.Min), text)
		placed = append(placed, box)
		d.placed = append(d.placed, text)
	}
	return placed
}

// placeLabel finds a box of size for a label of the point at, inside area,
// overlapping no obstacle, first among those crossing no segment.
func placeLabel(at, size vg.Point, area vg.Rectangle, obstacles []vg.Rectangle, segments [][2]vg.Point) (vg.Rectangle, bool) {
	w, h := size.X, size.Y
	var candidates []vg.Rectangle
	for _, gap := range []vg.Length{vg.Points(7), vg.Points(16), vg.Points(30)} {
		for _, min := range []vg.Point{
			{X: at.X + gap, Y: at.Y - h/2},         // right
			{X: at.X - gap - w, Y: at.Y - h/2},     // left
			{X: at.X - w/2, Y: at.Y + gap},         // above
			{X: at.X - w/2, Y: at.Y - gap - h},     // below
			{X: at.X + gap*0.7, Y: at.Y + gap*0.7}, // above right
			{X: at.X + gap*0.7, Y: at.Y - gap*0.7 - h},
			{X: at.X - gap*0.7 - w, Y: at.Y + gap*0.7},
			{X: at.X - gap*0.7 - w, Y: at.Y - gap*0.7 - h},
		} {
			candidates = append(candidates, vg.Rectangle{Min: min, Max: vg.Point{X: min.X + w, Y: min.Y + h}})
		}
	}
	fits := func(b vg.Rectangle) bool {
		if b.Min.X < area.Min.X || b.Min.Y < area.Min.Y || b.Max.X > area.Max.X || b.Max.Y > area.Max.Y {
			return false
		}
		for _, o := range obstacles {
			if tailplot.Overlaps(b, o) {
				return false
			}
		}
		return true
	}
	for _, strict := range []bool{true, false} {
		for _, b := range candidates {
			if !fits(b) {
				continue
			}
			if strict && slices.ContainsFunc(segments, func(s [2]vg.Point) bool { return crosses(s[0], s[1], b) }) {
				continue
			}
			return b, true
		}
	}
	return vg.Rectangle{}, false
}

// crosses reports whether the segment from a to b passes through box r
// (Liang–Barsky clipping).
func crosses(a, b vg.Point, r vg.Rectangle) bool {
	t0, t1 := 0.0, 1.0
	dx, dy := float64(b.X-a.X), float64(b.Y-a.Y)
	for _, e := range [4][2]float64{
		{-dx, float64(a.X - r.Min.X)}, {dx, float64(r.Max.X - a.X)},
		{-dy, float64(a.Y - r.Min.Y)}, {dy, float64(r.Max.Y - a.Y)},
	} {
		p, q := e[0], e[1]
		if p == 0 {
			if q < 0 {
				return false
			}
			continue
		}
		t := q / p
		if p < 0 {
			t0 = math.Max(t0, t)
		} else {
			t1 = math.Min(t1, t)
		}
		if t0 > t1 {
			return false
		}
	}
	return true
}
