package simulator

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/tailplot"
)

func TestParetoFrontKeepsOnlyTheSettingsNoOtherBeats(t *testing.T) {
	pt := func(q, dup, p999 float64) FrontierPoint {
		return FrontierPoint{Quantile: q, DuplicateRate: dup, P999: p999}
	}
	p999 := func(p FrontierPoint) float64 { return p.P999 }
	tests := []struct {
		name   string
		points []FrontierPoint
		front  []float64 // quantiles, in order of duplicate rate
	}{
		{"fewer duplicates buy a worse tail", []FrontierPoint{pt(0.5, 0.08, 2000), pt(0.9, 0.05, 2500), pt(0.99, 0.02, 4000)},
			[]float64{0.99, 0.9, 0.5}},
		{"hanging settings at the deadline beaten by one with fewer duplicates", []FrontierPoint{
			pt(0.5, 0.08, 30000), pt(0.75, 0.08, 30000), pt(0.9, 0.08, 30000), pt(0.95, 0.06, 2665), pt(0.97, 0.04, 2655), pt(0.99, 0.024, 4165)},
			[]float64{0.99, 0.97}},
		{"one setting better on both", []FrontierPoint{pt(0.9, 0.03, 2000), pt(0.5, 0.05, 2100), pt(0.99, 0.04, 2000)},
			[]float64{0.9}},
		{"equal duplicates, the lower tail only", []FrontierPoint{pt(0.9, 0.05, 2100), pt(0.95, 0.05, 2000)},
			[]float64{0.95}},
		{"identical settings both stay", []FrontierPoint{pt(0.95, 0.05, 2000), pt(0.97, 0.05, 2000)},
			[]float64{0.95, 0.97}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			front, dominated := paretoFront(tc.points, p999)
			var got []float64
			for _, p := range front {
				got = append(got, p.Quantile)
			}
			if !slices.Equal(got, tc.front) || len(front)+len(dominated) != len(tc.points) {
				t.Fatalf("front %v (and %d dominated), want %v", got, len(dominated), tc.front)
			}
			for _, d := range dominated {
				if !slices.ContainsFunc(tc.points, func(q FrontierPoint) bool {
					return q.DuplicateRate <= d.DuplicateRate && q.P999 <= d.P999 && (q.DuplicateRate < d.DuplicateRate || q.P999 < d.P999)
				}) {
					t.Errorf("q%v is faded but no setting beats it", d.Quantile)
				}
			}
		})
	}
}

// sweptFrontier is a frontier shaped like a real sweep's: settings that
// hang at the deadline at the duplicate ceiling, three ceilings whose
// settings coincide where the ceiling does not bind.
func sweptFrontier() *Frontier {
	f := &Frontier{Source: "test", Seed: 1, Ceilings: Ceilings{DuplicateRate: 0.08, ExtraCostRatio: 0.08}}
	rows := [][6]float64{ // quantile, ceiling, p99, p999, dup rate, extra cost
		{0.5, 0.05, 4160, 30000, 0.0499, 0.0306}, {0.5, 0.08, 4069, 30000, 0.0799, 0.0482}, {0.5, 0.12, 3570, 30000, 0.1198, 0.0716},
		{0.75, 0.05, 3803, 30000, 0.0498, 0.0308}, {0.75, 0.08, 3347, 30000, 0.0798, 0.0482}, {0.75, 0.12, 2946, 30000, 0.1197, 0.0721},
		{0.9, 0.05, 2993, 9283, 0.0497, 0.0302}, {0.9, 0.08, 1864, 6407, 0.0794, 0.0458}, {0.9, 0.12, 1689, 2304, 0.1037, 0.0595},
		{0.95, 0.05, 1940, 5343, 0.0488, 0.0292}, {0.95, 0.08, 1870, 2427, 0.0565, 0.0332}, {0.95, 0.12, 1870, 2427, 0.0565, 0.0332},
		{0.97, 0.05, 2082, 2694, 0.0388, 0.0234}, {0.97, 0.08, 2061, 2598, 0.0387, 0.0219}, {0.97, 0.12, 2061, 2598, 0.0387, 0.0219},
		{0.99, 0.05, 3487, 4365, 0.0209, 0.0130}, {0.99, 0.08, 3487, 4365, 0.0209, 0.0130}, {0.99, 0.12, 3487, 4365, 0.0209, 0.0130},
	}
	for _, r := range rows {
		f.Frontier = append(f.Frontier, FrontierPoint{Quantile: r[0], DuplicateCeiling: r[1], P99: r[2], P999: r[3],
			DuplicateRate: r[4], ExtraCostRatio: r[5]})
	}
	f.Recommended = recommend(f.Frontier, f.Ceilings)
	return f
}

// What the plot joins with each metric's line is its Pareto frontier, in
// order of duplicate rate with the metric falling (no zig-zag), and every
// other setting is drawn faded; nothing is left out.
func TestTheFrontierPlotJoinsOnlyUnbeatenSettingsInOrderOfDuplicates(t *testing.T) {
	f := sweptFrontier()
	d, err := f.drawing()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range frontierMetrics {
		front, faded := d.fronts[m.name], d.dominated[m.name]
		if len(front) < 2 || len(front)+len(faded) != len(f.Frontier) {
			t.Fatalf("%s: %d joined and %d faded of %d settings", m.name, len(front), len(faded), len(f.Frontier))
		}
		for i, xy := range front {
			if i > 0 && (xy.X < front[i-1].X || xy.Y > front[i-1].Y) {
				t.Fatalf("%s: the line goes from %v back to %v", m.name, front[i-1], xy)
			}
			for _, p := range f.Frontier {
				v := math.Max(m.of(p), 1)
				if p.DuplicateRate <= xy.X && v <= xy.Y && (p.DuplicateRate < xy.X || v < xy.Y) {
					t.Fatalf("%s: the line joins %v, which q%v/c%v beats", m.name, xy, p.Quantile, p.DuplicateCeiling)
				}
			}
		}
		for _, xy := range faded {
			if !slices.ContainsFunc(f.Frontier, func(p FrontierPoint) bool {
				v := math.Max(m.of(p), 1)
				return p.DuplicateRate <= xy.X && v <= xy.Y && (p.DuplicateRate < xy.X || v < xy.Y)
			}) {
				t.Fatalf("%s: %v is faded but no setting beats it", m.name, xy)
			}
		}
	}
}

// Drawn, the labels cover no other label and stay in the data area; the
// recommendation and every setting on a frontier keep theirs; the legend
// is beside the data area.
func TestTheFrontierPlotsLabelsDoNotCollide(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *Frontier
	}{
		{"three ceilings", sweptFrontier()},
		{"one ceiling", func() *Frontier {
			f := sweptFrontier()
			f.Frontier = slices.DeleteFunc(f.Frontier, func(p FrontierPoint) bool { return p.DuplicateCeiling != 0.08 })
			f.Recommended = recommend(f.Frontier, f.Ceilings)
			return f
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, layout, err := tc.f.writePlot(filepath.Join(t.TempDir(), "frontier.png"))
			if err != nil {
				t.Fatal(err)
			}
			labels := layout.Overlay
			for i, a := range labels {
				if a.Min.X < layout.Data.Min.X || a.Max.X > layout.Data.Max.X || a.Min.Y < layout.Data.Min.Y || a.Max.Y > layout.Data.Max.Y {
					t.Errorf("label %v leaves the data area %v", a, layout.Data)
				}
				for _, b := range labels[i+1:] {
					if tailplot.Overlaps(a, b) {
						t.Errorf("labels %v and %v overlap", a, b)
					}
				}
			}
			// Every label that is not a dominated setting's was drawn
			// (alone or joined with others at its spot).
			for _, l := range d.labels {
				if l.colour == fadedText {
					continue
				}
				if !slices.ContainsFunc(d.placed, func(text string) bool { return slices.Contains(strings.Fields(text), l.text) || text == l.text }) {
					t.Errorf("label %q was left out; drawn: %q", l.text, d.placed)
				}
			}
			if tailplot.Overlaps(layout.Legend, layout.Data) {
				t.Errorf("legend %v over the data area %v", layout.Legend, layout.Data)
			}
		})
	}
}
