// Command benchpath is `make bench-path`: what hedgerow's whole path costs
// beside the floor of one bare HTTP hop, measured in one run on this
// machine (docs/architecture.md §12, "The path's cost"; issue 31).
//
// It starts, as separate processes, `hedgerow fakellm --instant 20` (the
// only provider of the load), `hedgerow serve` with two routes on it (a
// configuration in a temporary directory; the internal listener on, with
// pprof), the bare reverse proxy proxyfloor in front of the same fake,
// and a second fake whose first token comes after 50 ms (--first-token,
// --timings) for the cancel race; then it measures, printing the load
// average at every step:
//
//   - the latency added at 500 requests/s over calling the fake directly,
//     for hedgerow and for the proxy, the three interleaved by a seeded
//     coin in one open-loop load (P50, P99, P99.9 and their ratios);
//   - the highest open-loop rate each sustains with P99 ≤ 25 ms, by a
//     bounded step search, hedgerow's and the proxy's steps alternating
//     (answers of 20 tokens, and streams of 20 tokens);
//   - CPU per request of each process: utime+stime from /proc/<pid>/stat
//     over the measured window, divided by the requests it served (serve
//     holds gateway, workers, embedded NATS and records);
//   - the cancel as the provider sees it: for hedgerow, from the winner's
//     first token to the loser's disconnect at the race fake (two routes
//     on it, a hedge launched after 10 ms, so every group races), beside
//     a client that cancels a request it sent the fake directly (from its
//     cancel to the fake seeing it go), quiet and under 500/s of load;
//   - a CPU profile of serve at the highest rate it sustained, through
//     the pprof endpoint, and its top 10 flat and cumulative.
//
// Every process it starts is stopped when it ends, fails or is
// interrupted (and killed with it if it is killed). Only ratios measured
// side by side in one run mean anything on a shared machine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/hostload"
)

// settings are one run's sizes: the full run's, or --quick's.
type settings struct {
	latWarmup, latDuration   time.Duration
	stepWarmup, stepDuration time.Duration
	searchStart, searchMin   float64
	searchMax                float64
	refine                   int
	probes                   int
	profile                  time.Duration
}

var (
	fullRun = settings{latWarmup: 3 * time.Second, latDuration: 20 * time.Second,
		stepWarmup: time.Second, stepDuration: 4 * time.Second, searchStart: 1000, searchMin: 250, searchMax: 16000, refine: 2,
		probes: 200, profile: 15 * time.Second}
	quickRun = settings{latWarmup: 2 * time.Second, latDuration: 6 * time.Second,
		stepWarmup: 500 * time.Millisecond, stepDuration: 2 * time.Second, searchStart: 1000, searchMin: 250, searchMax: 8000, refine: 1,
		probes: 60, profile: 6 * time.Second}
)

// options are the command line's.
type options struct {
	hedgerow, proxyfloor, goTool string
	out                          string
	quick, keep                  bool
	rate                         float64
	bound                        time.Duration
	profileRate                  float64
	seed                         uint64
	// syncInterval is serve's nats.sync_interval; empty: its default,
	// always (an fsync before every JetStream ack, docs/architecture.md §6).
	syncInterval string
}

// syncText names serve's sync_interval.
func (o options) syncText() string {
	if o.syncInterval == "" {
		return "always, the default"
	}
	return o.syncInterval
}

func main() {
	var o options
	flag.StringVar(&o.hedgerow, "hedgerow", "bin/hedgerow", "the hedgerow binary (make build)")
	flag.StringVar(&o.proxyfloor, "proxyfloor", "bin/proxyfloor", "the proxyfloor binary")
	flag.StringVar(&o.goTool, "go", "go", "the go command, for go tool pprof")
	flag.StringVar(&o.out, "out", "bin/bench-path", "directory for the profile and the printed report")
	flag.BoolVar(&o.quick, "quick", false, "a shorter smoke run (about a minute and a half)")
	flag.BoolVar(&o.keep, "keep", false, "keep the run's directory (configuration, logs, NATS store)")
	flag.Float64Var(&o.rate, "rate", 500, "requests/s per target of the added-latency run and of the cancels' load")
	flag.DurationVar(&o.bound, "p99", 25*time.Millisecond, "the P99 a sustained rate must keep")
	flag.Float64Var(&o.profileRate, "profile-rate", 0, "rate of the profiled load (0: the highest hedgerow sustained)")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the arrivals and of the target coin")
	flag.StringVar(&o.syncInterval, "sync-interval", "", "serve's nats.sync_interval (default: always, every JetStream write fsynced before its ack); e.g. 2m to see what the fsyncs cost")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-path:", err)
		os.Exit(1)
	}
}

// run sets the parts up, measures, and stops every part whatever happens.
func run(o options) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := fullRun
	if o.quick {
		s = quickRun
	}
	for _, bin := range []string{o.hedgerow, o.proxyfloor} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%w (make bench-path builds it)", err)
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	report, err := os.Create(filepath.Join(o.out, "report.txt"))
	if err != nil {
		return fmt.Errorf("out: %w", err)
	}
	defer report.Close()
	dir, err := os.MkdirTemp("", "hedgerow-bench-path-")
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	b := &bench{o: o, s: s, dir: dir, w: io.MultiWriter(os.Stdout, report)}
	defer func() {
		if serr := b.ps.stopAll(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stopping the parts: %w", serr))
		}
		if o.keep || err != nil {
			fmt.Fprintf(os.Stderr, "bench-path: the run's configuration and logs are in %s\n", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if err := b.startParts(ctx, cancel); err != nil {
		return err
	}
	if err := b.measure(ctx); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause // a part died: that is the error, not the load's
		}
		return err
	}
	return nil
}

// bench is one run.
type bench struct {
	o   options
	s   settings
	dir string
	w   io.Writer
	ps  procs

	fake, race, serve, proxy *proc
	fakeURL, raceURL         string // the fakes' roots
	serveURL, internalURL    string // serve's API and internal listeners
	proxyURL                 string
}

// startParts starts the fakes, serve and the proxy, and waits until each
// answers. A part that exits before the run ends cancels it.
func (b *bench) startParts(ctx context.Context, cancel context.CancelCauseFunc) error {
	ports := make([]int, 6)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	url := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	b.fakeURL, b.raceURL, b.serveURL, b.internalURL, b.proxyURL = url(ports[0]), url(ports[1]), url(ports[2]), url(ports[3]), url(ports[4])

	var err error
	if b.fake, err = b.ps.start(b.dir, "fakellm", b.o.hedgerow, "fakellm", "--listen", addr(ports[0]), "--instant", "20", "--log-level", "warn"); err != nil {
		return err
	}
	if b.race, err = b.ps.start(b.dir, "fakellm-race", b.o.hedgerow, "fakellm", "--listen", addr(ports[1]), "--instant", "20",
		"--first-token", raceFirstToken.String(), "--timings", "4096", "--log-level", "warn"); err != nil {
		return err
	}
	cfg := filepath.Join(b.dir, "serve.yaml")
	if err := os.WriteFile(cfg, []byte(serveConfig(b.dir, addr(ports[2]), addr(ports[3]), b.fakeURL, b.raceURL, b.o.syncInterval)), 0o600); err != nil {
		return fmt.Errorf("serve configuration: %w", err)
	}
	if b.serve, err = b.ps.start(b.dir, "serve", b.o.hedgerow, "serve", "--config", cfg, "--log-level", "warn"); err != nil {
		return err
	}
	if b.proxy, err = b.ps.start(b.dir, "proxyfloor", b.o.proxyfloor, "--listen", addr(ports[4]), "--to", b.fakeURL); err != nil {
		return err
	}
	for _, p := range []*proc{b.fake, b.race, b.serve, b.proxy} {
		go func(p *proc) {
			select {
			case <-p.done:
				cancel(fmt.Errorf("%s exited during the run (%v); its log ends:\n%s", p.name, p.err, p.logTail(20)))
			case <-ctx.Done():
			}
		}(p)
	}
	ready := []struct {
		p   *proc
		url string
	}{
		{b.fake, b.fakeURL + "/healthz"}, {b.race, b.raceURL + "/healthz"},
		{b.serve, b.internalURL + "/readyz"}, {b.proxy, b.proxyURL + "/healthz"}, // the proxy passes it to the fake
	}
	for _, r := range ready {
		if err := r.p.waitReady(ctx, r.url); err != nil {
			return err
		}
	}
	return nil
}

// raceFirstToken is when the race fake sends its first token, and
// raceHedgeDelay when hedgerow launches the hedge: every race probe's
// primary wins at 50 ms and its hedge, 40 ms in, is cancelled.
const (
	raceFirstToken = 50 * time.Millisecond
	raceHedgeDelay = 10 * time.Millisecond
)

// serveConfig is serve's configuration: NATS in process (its JetStream in
// dir), the internal listener with pprof, pool general on two routes to
// the instant fake under the default policy, and pool race on two routes
// to the race fake under policy race, which hedges every group after
// raceHedgeDelay and never counts a hedge against a budget. syncInterval,
// when set, is its nats.sync_interval.
func serveConfig(dir, listen, internal, fakeURL, raceURL, syncInterval string) string {
	sync := ""
	if syncInterval != "" {
		sync = fmt.Sprintf("  sync_interval: %q\n", syncInterval)
	}
	return fmt.Sprintf(`# make bench-path: serve in front of the instant fake (pool general,
# default policy) and the race fake (pool race, policy race).
nats:
  store_dir: %q
%shttp:
  listen: %q
  internal_listen: %q
  pprof: true
routes:
  - {name: instant-a, provider: openai, base_url: %q, model: instant}
  - {name: instant-b, provider: openai, base_url: %q, model: instant}
  - {name: race-a, provider: openai, base_url: %q, model: instant}
  - {name: race-b, provider: openai, base_url: %q, model: instant}
pools:
  general: {routes: [instant-a, instant-b]}
  race: {routes: [race-a, race-b]}
policies:
  race:
    hedge: true
    idempotent: true
    control_fraction: 0
    max_attempts: 2
    delay: {min: %s, max: %s, initial: %s}
    duplicate_rate: {ceiling: 1, burst_window: 0, reserve: {burst: 1000000, per_minute: 1000000}}
    guardrail: {enabled: false}
`, filepath.Join(dir, "nats"), sync, listen, internal, fakeURL+"/v1", fakeURL+"/v1", raceURL+"/v1", raceURL+"/v1",
		raceHedgeDelay, raceHedgeDelay, raceHedgeDelay)
}

// header prints what the run is and where.
func (b *bench) header() {
	mode := "full"
	if b.o.quick {
		mode = "quick"
	}
	fmt.Fprintf(b.w, "hedgerow bench-path (%s run), %s, %d CPUs, GOMAXPROCS %d; load average at start %s\n",
		mode, time.Now().Format(time.RFC3339), runtime.NumCPU(), runtime.GOMAXPROCS(0), hostload.Averages())
	fmt.Fprintf(b.w, "parts: fakellm --instant 20 (pid %d) · serve, 2 routes on it, pprof on its internal listener, nats.sync_interval %s (pid %d) · proxyfloor in front of the same fake (pid %d) · race fake, first token after %v, hedge after %v (pid %d)\n\n",
		b.fake.pid(), b.o.syncText(), b.serve.pid(), b.proxy.pid(), raceFirstToken, raceHedgeDelay, b.race.pid())
}

// step prints a line of progress, stamped with the time and load average.
func (b *bench) step(format string, args ...any) {
	fmt.Fprintf(b.w, "[%s load %s] %s\n", time.Now().Format("15:04:05"), hostload.Averages(), fmt.Sprintf(format, args...))
}

// measure runs every phase and prints the summary.
func (b *bench) measure(ctx context.Context) error {
	b.header()
	var sum summary
	var err error
	if sum.idle, err = b.idle(ctx); err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	if sum.latency, err = b.latency(ctx); err != nil {
		return fmt.Errorf("added latency: %w", err)
	}
	for _, stream := range []bool{false, true} {
		res, err := b.throughput(ctx, stream)
		if err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
		sum.throughput = append(sum.throughput, res)
	}
	for _, loaded := range []bool{false, true} {
		res, err := b.cancels(ctx, loaded)
		if err != nil {
			return fmt.Errorf("cancels: %w", err)
		}
		sum.cancels = append(sum.cancels, res)
	}
	rate := b.o.profileRate
	if rate == 0 {
		rate, _ = sum.throughput[0].hedgerow.best()
	}
	if rate > 0 {
		if sum.profile, err = b.profile(ctx, rate); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	sum.loadEnd = hostload.Averages()
	return sum.write(b.w, b.o)
}

// idleFor is how long the parts' idle CPU is measured before any load.
const idleFor = 2 * time.Second

// idle measures the CPU each part spends a second with no load (timers,
// heartbeats, the embedded NATS server's housekeeping): what every
// window's CPU per request carries besides the requests.
func (b *bench) idle(ctx context.Context) (map[string]time.Duration, error) {
	meter, err := newCPUMeter(map[string]int{"serve": b.serve.pid(), "proxyfloor": b.proxy.pid(), "fakellm": b.fake.pid()})
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(idleFor):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	spent, err := meter.spent()
	if err != nil {
		return nil, err
	}
	perSecond := map[string]time.Duration{}
	for part, d := range spent {
		perSecond[part] = d * time.Second / idleFor
	}
	b.step("idle, no load for %v: CPU per second serve %.1f ms, proxyfloor %.1f ms, fakellm %.1f ms", idleFor,
		ms(perSecond["serve"]), ms(perSecond["proxyfloor"]), ms(perSecond["fakellm"]))
	return perSecond, nil
}

// get fetches url into a file (the profile), bounded by ctx.
func get(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pprofTop runs go tool pprof -top on the profile, flat or cumulative.
func (b *bench) pprofTop(ctx context.Context, file string, cum bool) (string, error) {
	args := []string{"tool", "pprof", "-top", "-nodecount=10"}
	if cum {
		args = append(args, "-cum")
	}
	out, err := exec.CommandContext(ctx, b.o.goTool, append(args, b.o.hedgerow, file)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w\n%s", err, out)
	}
	return string(out), nil
}
