package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// The names the demo's configuration gives its parts.
const (
	poolName      = "general"
	classPrimary  = "primary"
	classHedged   = "hedged"
	routePrefix   = "fake-"
	upstreamModel = "gpt4o"
)

// modelDeadline is the pinned deadline of docs/architecture.md §11, in model time.
const modelDeadline = 30 * time.Second

// cluster is the live system under load: three fake LLM routes and `serve`
// (embedded NATS, a worker per route, the gateway) in front of them.
type cluster struct {
	fakes []*node.FakeLLM
	serve *node.Serve
	cfg   *config.Config
	// auth holds the NATS users generated for this run (natsauth): serve's
	// listener admits only them, and the recorder reads the records as
	// the observer. Removed by stop.
	auth string
}

// observerSeed is the nkey seed file of the observer user, which may only
// read the records.
func (c *cluster) observerSeed() string { return filepath.Join(c.auth, natsauth.UserObserver+".nk") }

// startCluster starts the fake routes on loopback ephemeral ports, then
// serve on a configuration naming them. Every route plays the same seed
// with its own route number, as fakellm requires for independent latencies
// with one output length per request.
func startCluster(o Options, key []byte, log *slog.Logger) (*cluster, error) {
	c := &cluster{}
	for r := range routes {
		f, err := node.StartFakeLLM("127.0.0.1:0", fakellm.Options{
			Workload: o.Workload, Seed: o.Seed, TimeScale: o.TimeScale, Route: r, OpenEarly: o.OpenEarly,
			// Records are read after every run, so the ring must hold one
			// run's attempts on one route (at most two per request). The
			// default 100,000 is kept above that on purpose: a smaller
			// heap measured 6× more GC cycles, each with a ~2 ms stop,
			// inside the process being measured.
			StatsCapacity: max(2*max(o.Requests, o.Warmup)+1024, fakellm.DefaultStatsCapacity),
		}, log.With("component", "fakellm", "route", r))
		if err != nil {
			return nil, errors.Join(fmt.Errorf("start fake route %d: %w", r, err), c.stop(context.Background()))
		}
		c.fakes = append(c.fakes, f)
	}
	// serve's NATS listener is reachable by other processes, so it admits
	// only users generated for this run: serve itself and the observer.
	auth, err := os.MkdirTemp("", "hedgerow-demo-nats-")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("demo nats users: %w", err), c.stop(context.Background()))
	}
	c.auth = auth
	if err := writeUsers(auth, o); err != nil {
		return nil, errors.Join(err, c.stop(context.Background()))
	}
	data := configYAML(o, c.baseURLs(), auth)
	cfg, err := config.Parse("demo.yaml", []byte(data), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, errors.Join(fmt.Errorf("demo configuration: %w", err), c.stop(context.Background()))
	}
	c.cfg = cfg
	c.serve, err = node.StartServe(cfg, node.Options{Logger: log, FingerprintKey: key})
	if err != nil {
		return nil, errors.Join(err, c.stop(context.Background()))
	}
	return c, nil
}

// routes is how many equivalent routes the pool has.
const routes = 3

func (c *cluster) baseURLs() []string {
	out := make([]string, len(c.fakes))
	for i, f := range c.fakes {
		out[i] = "http://" + f.Addr().String()
	}
	return out
}

// routeIndex maps a configured route name to the fake route it points at.
func routeIndex(name string) (int, bool) {
	for r := range routes {
		if name == routeName(r) {
			return r, true
		}
	}
	return 0, false
}

func routeName(r int) string { return fmt.Sprintf("%s%d", routePrefix, r) }

// stop shuts serve down, then the fakes, within ctx.
func (c *cluster) stop(ctx context.Context) error {
	var errs []error
	if c.serve != nil {
		if err := c.serve.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop serve: %w", err))
		}
	}
	for i, f := range c.fakes {
		if err := f.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop fake route %d: %w", i, err))
		}
	}
	if c.auth != "" {
		if err := os.RemoveAll(c.auth); err != nil {
			errs = append(errs, fmt.Errorf("remove demo nats users: %w", err))
		}
	}
	return errors.Join(errs...)
}

// configYAML is the demo's configuration. Durations the workload model
// decides are scaled by the time scale, so the policy sees the model as
// production would see the real provider: the 30 s deadline, the 500 ms
// minimum useful time and the delay clamps (min 100 ms, initial 1 s, max
// 10 s). What measures the system rather than the model keeps its default:
// accept and heartbeat timeouts (wire latencies are real; the accept
// timeout at most half the scaled deadline), the delay
// estimator's window and warm-up (sample counts: at 100 requests/s real a
// 5-minute window holds about as many samples as at the pinned 50/s of
// model time), the budgets and the guardrail. The primary class is the
// simulator's `none` strategy: one attempt, no hedge, no replacement.
func configYAML(o Options, baseURLs []string, auth string) string {
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.TimeScale) }
	var b strings.Builder
	fmt.Fprintf(&b, "nats:\n  listen: 127.0.0.1:0\n  server_config: %q\n  nkey_seed_file: %q\n",
		filepath.Join(auth, natsauth.ServerConfigFile), filepath.Join(auth, natsauth.UserServe+".nk"))
	fmt.Fprintf(&b, "http:\n  listen: 127.0.0.1:0\n")
	fmt.Fprintf(&b, "routes:\n")
	for r, u := range baseURLs {
		fmt.Fprintf(&b, "  - name: %s\n    provider: openai\n    base_url: %s/v1\n    model: %s\n    labels: {provider: fakellm, region: r%d}\n",
			routeName(r), u, upstreamModel, r)
	}
	fmt.Fprintf(&b, "pools:\n  %s:\n    routes: [", poolName)
	for r := range baseURLs {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteString(routeName(r))
	}
	b.WriteString("]\n")
	deadline, useful := scale(modelDeadline), scale(500*time.Millisecond)
	// The accept timeout keeps its real default unless the scaled deadline
	// is shorter: it must leave the attempt time to answer.
	accept := min(config.Defaults().AcceptTimeout, deadline/2)
	fmt.Fprintf(&b, "policies:\n")
	fmt.Fprintf(&b, "  %s:\n    hedge: false\n    max_attempts: 1\n    deadline: %v\n    min_useful_time: %v\n    accept_timeout: %v\n", classPrimary, deadline, useful, accept)
	fmt.Fprintf(&b, "  %s:\n    hedge: true\n    deadline: %v\n    min_useful_time: %v\n    accept_timeout: %v\n", classHedged, deadline, useful, accept)
	fmt.Fprintf(&b, "    delay: {min: %v, initial: %v, max: %v}\n", scale(100*time.Millisecond), scale(time.Second), scale(10*time.Second))
	return b.String()
}

// writeUsers generates the run's NATS users into dir: nkeys, the workers'
// replies bounded by the demo's deadline.
func writeUsers(dir string, o Options) error {
	names := make([]string, routes)
	for r := range routes {
		names[r] = routeName(r)
	}
	b, err := natsauth.Generate(natsauth.Spec{Routes: names, Serve: true,
		Responses: natsauth.ResponsesFor(time.Duration(float64(modelDeadline)*o.TimeScale), 0)})
	if err != nil {
		return fmt.Errorf("demo nats users: %w", err)
	}
	return b.Write(dir)
}
