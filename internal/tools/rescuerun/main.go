// Command rescuerun is a fault run of hedgerow's rescue (docs/architecture.md
// §6, "Rescue"; §12, "The rescue fault run"): for each way a provider can
// break a stream after its commit — cut, in-band error, malformed event,
// stall, truncated answer — it starts three simulated routes in process
// (fakellm behind httptest, one of them breaking every stream after its
// sixth token, all continuing in continue_final_message style) and serve
// over them with two pools, "rescued" (rescue: continue, max 1) and
// "plain" (rescue off). It sends each pool the same number of seeded
// requests, half of them streaming, and checks every answer whole against
// the simulator's full text. The plain pool is read as today's client
// does: a stream that ends stream_interrupted is sent again at once, and
// its time runs from the first try to the end of the stream that
// succeeded. It prints, per fault, the breaks, the stream_interrupted the
// caller saw, the invalid answers and the P50/P99 time to the end of the
// stream of both, side by side, and exits 1 if the rescued pool let a
// stream_interrupted or an invalid answer through.
//
//	go run ./internal/tools/rescuerun [--requests 20] [--rounds 1] [--concurrency 4] [--seed 1] [--faults cut,error,malformed,stall,truncate]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/tools/hostload"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

func main() {
	o := defaultOptions()
	var faults string
	flag.IntVar(&o.requests, "requests", o.requests, "requests per fault and pool, half of them streaming")
	flag.IntVar(&o.rounds, "rounds", o.rounds, "times each fault runs, each time on routes and a serve of its own; the table adds them up")
	flag.IntVar(&o.concurrency, "concurrency", o.concurrency, "requests in flight at once")
	flag.Uint64Var(&o.seed, "seed", o.seed, "seed of the request contents and of the routes")
	flag.StringVar(&faults, "faults", strings.Join(modeNames(o.faults), ","), "break modes to run, in order")
	flag.IntVar(&o.breakAfter, "break-after", o.breakAfter, "content tokens the faulty route sends before it breaks a stream")
	flag.IntVar(&o.maxTokens, "max-tokens", o.maxTokens, "max_tokens of every request (answers are about 24 tokens)")
	flag.Float64Var(&o.timeScale, "time-scale", o.timeScale, "real seconds per model second of the simulated routes")
	flag.DurationVar(&o.stallBound, "stall-bound", o.stallBound, "the policy's stall_after_first_token and stall_floor")
	flag.Parse()
	if err := o.setFaults(faults); err != nil {
		fmt.Fprintln(os.Stderr, "rescuerun:", err)
		os.Exit(2)
	}
	failed, err := run(context.Background(), o, os.Stdout)
	if err == nil {
		// Every route, serve and connection is closed: nothing of the run
		// may be left running.
		err = goleak.Find()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rescuerun:", err)
		os.Exit(2)
	}
	if failed != "" {
		fmt.Fprintln(os.Stderr, "rescuerun: FAIL:", failed)
		os.Exit(1)
	}
}

// options is one run's settings.
type options struct {
	faults      []fakellm.BreakMode
	requests    int
	rounds      int
	concurrency int
	seed        uint64
	breakAfter  int
	maxTokens   int
	timeScale   float64
	stallBound  time.Duration
}

func defaultOptions() options {
	return options{
		faults:   []fakellm.BreakMode{fakellm.BreakCut, fakellm.BreakError, fakellm.BreakMalformed, fakellm.BreakStall, fakellm.BreakTruncate},
		requests: 20, rounds: 1, concurrency: 4, seed: 1, breakAfter: 6, maxTokens: 60,
		// A model second is a real millisecond.
		timeScale:  0.001,
		stallBound: 300 * time.Millisecond,
	}
}

func modeNames(ms []fakellm.BreakMode) []string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = string(m)
	}
	return names
}

func (o *options) setFaults(list string) error {
	o.faults = nil
	for _, name := range strings.Split(list, ",") {
		m, err := fakellm.ParseBreakMode(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		o.faults = append(o.faults, m)
	}
	switch {
	case o.requests < 2 || o.requests%2 != 0:
		return fmt.Errorf("--requests %d: want an even number of at least 2", o.requests)
	case o.rounds < 1:
		return fmt.Errorf("--rounds %d: want at least 1", o.rounds)
	case o.concurrency < 1:
		return fmt.Errorf("--concurrency %d: want at least 1", o.concurrency)
	case o.breakAfter < 1 || o.breakAfter >= answerTokens:
		return fmt.Errorf("--break-after %d: want 1 to %d, inside the %d-token answers", o.breakAfter, answerTokens-1, answerTokens)
	case o.maxTokens <= answerTokens:
		return fmt.Errorf("--max-tokens %d: want more than the %d-token answers, so a whole answer ends with stop", o.maxTokens, answerTokens)
	case o.timeScale <= 0 || o.stallBound <= 0:
		return errors.New("--time-scale and --stall-bound must be positive")
	}
	return nil
}

// run runs every fault and prints the table; failed says why the rescued
// pool failed the run, empty when it did not.
func run(ctx context.Context, o options, out io.Writer) (failed string, err error) {
	start := hostload.Averages()
	fmt.Fprintf(out, "rescuerun: %d faults × %d round(s) × 2 pools × %d requests (%d streaming), %d in flight; 3 routes, 1 faulty "+
		"(every stream broken after %d tokens), continue_final_message; max_tokens %d; time scale %g; stall bound %v; seed %d\n",
		len(o.faults), o.rounds, o.requests, o.requests/2, o.concurrency, o.breakAfter, o.maxTokens, o.timeScale, o.stallBound, o.seed)
	fmt.Fprintf(out, "load average at start: %s\n\n", start)
	began := time.Now()
	var results []faultResult
	for _, f := range o.faults {
		r, err := runFault(ctx, o, f)
		if err != nil {
			return "", fmt.Errorf("fault %s: %w", f, err)
		}
		results = append(results, r)
	}
	printTable(out, results)
	fmt.Fprintf(out, "\nload average at end: %s (the run took %v)\n", hostload.Averages(), time.Since(began).Round(time.Millisecond))
	var why []string
	for _, r := range results {
		p := r.pools[poolRescued]
		if p.interrupted > 0 || p.invalid > 0 {
			why = append(why, fmt.Sprintf("%s: the rescued pool let %d stream_interrupted and %d invalid answers through",
				r.fault, p.interrupted, p.invalid))
		}
	}
	return strings.Join(why, "; "), nil
}

// loadAvg1 is the one-minute load average of hostload.Averages' line.
func loadAvg1(line string) string {
	if f := strings.Fields(line); len(f) > 0 {
		return f[0]
	}
	return "?"
}
