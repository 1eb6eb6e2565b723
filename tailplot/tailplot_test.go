package tailplot

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"gonum.org/v1/plot/plotter"
)

// sample draws n latencies, sorted, from a seeded log-normal around 800 ms.
func sample(seed uint64, n int) []float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Round(800 * math.Exp(0.5*rng.NormFloat64()))
	}
	slices.Sort(out)
	return out
}

// shareAtOrAbove counts independently the share of sorted at or above x.
func shareAtOrAbove(sorted []float64, x float64) float64 {
	k := 0
	for _, v := range sorted {
		if v >= x {
			k++
		}
	}
	return float64(k) / float64(len(sorted))
}

func TestATailIsAStaircaseAtTheShareAtOrAboveEachLatency(t *testing.T) {
	tests := []struct {
		name   string
		sorted []float64
		from   float64 // the level is checked where the curve is below this share (every rank kept)
	}{
		{"one value", []float64{700}, 1.01},
		{"ties", []float64{100, 200, 200, 200, 900}, 1.01},
		{"a control arm of 69", sample(1, 69), 1.01},
		{"a hedged arm of 20,000, its body sampled", sample(2, 20_000), 0.1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pts := Points(tc.sorted)
			n := float64(len(tc.sorted))
			first, last := pts[0], pts[len(pts)-1]
			if first != (plotter.XY{X: tc.sorted[0], Y: 1}) || last != (plotter.XY{X: tc.sorted[len(tc.sorted)-1], Y: 1 / n}) {
				t.Fatalf("curve runs from %v to %v, want from (fastest, 1) to (slowest, 1/n)", first, last)
			}
			levels := 0
			for i := 1; i < len(pts); i++ {
				a, b := pts[i-1], pts[i]
				if a.X != b.X && a.Y != b.Y {
					t.Fatalf("segment %v → %v is neither level nor a drop: the curve joins samples with slopes", a, b)
				}
				if b.X < a.X || b.Y > a.Y {
					t.Fatalf("segment %v → %v goes back", a, b)
				}
				if a.Y == b.Y && a.X < b.X && a.Y < tc.from {
					mid := (a.X + b.X) / 2
					if want := shareAtOrAbove(tc.sorted, mid); math.Abs(a.Y-want) > 1e-12 {
						t.Fatalf("level %v between %v and %v ms, want the share at or above %v ms, %v", a.Y, a.X, b.X, mid, want)
					}
					levels++
				}
			}
			if len(tc.sorted) > 1 && levels == 0 {
				t.Fatal("no level of the staircase was checked")
			}
		})
	}
}

func TestTheLegendSitsInAColumnBesideTheDataAreaNeverOverIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		series []Series
	}{
		{"a cohort's arms and the total's bands", []Series{
			{Name: "default/general/complete hedged", Latencies: sample(3, 2000), Emphasis: true},
			{Name: "default/general/complete control", Latencies: sample(4, 100), Dashed: true},
			{Name: "default/text-embedding-3-small/complete hedged", Latencies: []float64{527}, Emphasis: true},
			{Name: "total hedged", Latencies: sample(3, 2001), Band: true},
		}},
		{"one short series", []Series{{Name: "a", Latencies: sample(5, 50)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("test", tc.series)
			if err != nil {
				t.Fatal(err)
			}
			l, err := Save(p, Width, Height, filepath.Join(t.TempDir(), "tail.png"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if Overlaps(l.Legend, l.Data) || l.Legend.Min.X < l.Data.Max.X {
				t.Fatalf("legend %v overlaps or is left of the data area %v", l.Legend, l.Data)
			}
			if l.Legend.Size().X <= 0 || l.Legend.Size().Y <= 0 || l.Legend.Max.X > l.Canvas.Max.X || l.Legend.Min.Y < l.Canvas.Min.Y {
				t.Fatalf("legend %v is empty or leaves the image %v", l.Legend, l.Canvas)
			}
			if l.Data.Size().X < Width/2 || l.Data.Size().Y < Height/2 {
				t.Fatalf("data area %v is less than half the plot's %v × %v", l.Data, Width, Height)
			}
		})
	}
}

func TestNothingToDrawIsErrNoData(t *testing.T) {
	if _, err := New("empty", []Series{{Name: "a"}}); err != ErrNoData {
		t.Fatalf("New of an empty series = %v, want ErrNoData", err)
	}
}

func TestLatencyTicksLabelOneTwoAndFiveOfEachDecade(t *testing.T) {
	tests := []struct {
		lo, hi float64
		labels []string
	}{
		{300, 4500, []string{"500", "1000", "2000"}},
		{1, 30000, []string{"1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "2000", "5000", "10000", "20000"}},
		{1500, 1900, nil},
	}
	for _, tc := range tests {
		var labels []string
		for _, tk := range (Ticks125{}).Ticks(tc.lo, tc.hi) {
			if tk.Value < tc.lo || tk.Value > tc.hi {
				t.Errorf("[%v, %v]: tick %v outside the range", tc.lo, tc.hi, tk.Value)
			}
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if !slices.Equal(labels, tc.labels) {
			t.Errorf("[%v, %v]: labels %v, want %v", tc.lo, tc.hi, labels, tc.labels)
		}
	}
}
