package simulator

import (
	"fmt"

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
