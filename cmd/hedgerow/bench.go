package main

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
)

// apiKeyEnv is the default of --api-key-env, the environment variable
// bench reads a tenant's API key from. There is no flag for the key itself:
// flags are visible to every user of the host in the process list.
const apiKeyEnv = "HEDGEROW_API_KEY"

func newBenchCmd() *cobra.Command {
	opts := loadgen.BenchOptions{Rate: 100, Duration: 10 * time.Second, Warmup: 2 * time.Second, Seed: 1,
		MaxTokens: loadgen.DefaultBenchMaxTokens, Timeout: loadgen.DefaultBenchTimeout}
	var (
		natsURLs            []string
		natsSeed, natsInbox string
		keyEnv              string
		asJSON              bool
		quiet               bool
	)
	cmd := &cobra.Command{
		Use:   "bench (--url URL | --nats URL,...) [--rate R] [--duration D] [--stream] [--compare-direct URL]",
		Short: "Load a running gateway open-loop over HTTP or NATS and print its latency percentiles",
		Long: `bench sends chat requests to a running gateway at seeded Poisson arrival times, whether or
not earlier ones were answered (open loop: a slow gateway cannot slow the load down and hide its
tail), through its OpenAI-compatible HTTP front door (--url) or its NATS front door hedgerow.submit
(--nats). After an unmeasured warm-up it prints P50, P90, P99, P99.9 and max of each request's
time from when it was due to the end of its answer, the time to the first token of streams, and
the errors by code; --json prints one JSON object. A gateway with tenants configured needs a
tenant's key in $HEDGEROW_API_KEY (or the variable --api-key-env names), sent to either door as
'Authorization: Bearer <key>'; at the gateway's first 401 bench stops and says which variable to
set. When any request failed, bench prints its whole report and then exits non-zero (status 1),
naming the failures on stderr.

--compare-direct URL measures what the gateway adds: every arrival goes, by a seeded coin, either
to the gateway or straight to URL — one of the gateway's routes — so both run side by side in one
run under the same load (--rate per target), and the report adds a row "added by the gateway"
(gateway minus direct, quantile by quantile). For the whole path's own cost, point the routes at a
route with no latency of its own: ` + "`hedgerow fakellm --instant 20`" + ` answers every request at once
with exactly 20 tokens.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (opts.URL == "") == (len(natsURLs) == 0) {
				return errors.New("bench: give exactly one of --url and --nats")
			}
			opts.APIKey = os.Getenv(keyEnv)
			if len(natsURLs) > 0 {
				var auth []nats.Option
				if natsSeed != "" {
					seed, err := nats.NkeyOptionFromSeed(natsSeed)
					if err != nil {
						return fmt.Errorf("bench: --nats-nkey-seed: %w", err)
					}
					auth = append(auth, seed)
				}
				if natsInbox != "" {
					auth = append(auth, nats.CustomInboxPrefix(natsInbox))
				}
				nc, err := node.Connect(natsURLs, "hedgerow-bench", nil, auth...)
				if err != nil {
					return fmt.Errorf("bench: %w", err)
				}
				defer nc.Close()
				if opts.NATS, err = client.New(nc, client.WithTimeout(opts.Timeout), client.WithAPIKey(opts.APIKey)); err != nil {
					return fmt.Errorf("bench: %w", err)
				}
				opts.NATSURL = strings.Join(natsURLs, ",")
			}
			targets := 1.0
			if opts.CompareDirect != "" {
				targets = 2
			}
			total := math.Round(opts.Rate*targets*opts.Duration.Seconds()) + math.Round(opts.Rate*targets*opts.Warmup.Seconds())
			step, done := progress(int64(max(total, 0)), "bench", quiet)
			if step != nil {
				opts.Progress = func(loadgen.Result) { step(1) }
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := loadgen.Bench(ctx, opts)
			done()
			if errors.Is(err, loadgen.ErrUnauthorized) {
				return unauthorizedError("bench", keyEnv, opts.APIKey != "", err)
			}
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			if err := printReport(cmd.OutOrStdout(), rep, asJSON); err != nil {
				return err
			}
			return benchFailures(rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.URL, "url", "", "root of the gateway's HTTP front door, e.g. http://127.0.0.1:8080")
	f.StringSliceVar(&natsURLs, "nats", nil, "NATS servers of the gateway's NATS front door, comma-separated")
	f.StringVar(&keyEnv, "api-key-env", apiKeyEnv, "environment variable holding a tenant's API key, sent to either front door as 'Authorization: Bearer <key>' (never the key itself: flags show in the process list)")
	f.StringVar(&natsSeed, "nats-nkey-seed", "", "nkey seed file of a client user hedgerow nats-auth wrote (with --nats)")
	f.StringVar(&natsInbox, "nats-inbox-prefix", "", "inbox prefix of that client user, e.g. _INBOX.cl.client (with --nats)")
	f.StringVar(&opts.CompareDirect, "compare-direct", "", "root of one of the gateway's routes, called directly side by side (e.g. http://127.0.0.1:9101)")
	f.StringVar(&opts.DirectModel, "direct-model", "", "model named to the direct route (default: --model)")
	f.StringVar(&opts.Model, "model", loadgen.DefaultBenchModel, "pool (model class) to ask for")
	f.StringVar(&opts.Operation, "operation", "", "operation class (policy); empty: the gateway's default")
	f.StringVar(&opts.Prompt, "prompt", loadgen.DefaultBenchPrompt, "start of every request's user message")
	f.IntVar(&opts.MaxTokens, "max-tokens", opts.MaxTokens, "max_tokens of every request")
	f.BoolVar(&opts.Stream, "stream", false, "ask for streamed answers")
	f.Float64Var(&opts.Rate, "rate", opts.Rate, "Poisson arrival rate per target, requests per second")
	f.DurationVar(&opts.Duration, "duration", opts.Duration, "how long the measured run sends")
	f.DurationVar(&opts.Warmup, "warmup", opts.Warmup, "unmeasured run at the same rate before it")
	f.DurationVar(&opts.Timeout, "timeout", opts.Timeout, "each request's client deadline")
	f.IntVar(&opts.MaxInFlight, "max-inflight", loadgen.DefaultMaxInFlight, "safety cap on requests in flight (sends it holds back are counted)")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "seed of the arrivals and of the gateway/direct coin")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	return cmd
}

// unauthorizedError says what to do about a gateway's 401: set the
// variable the key is read from, or check the key it holds. cause is what
// the gateway answered.
func unauthorizedError(cmd, keyEnv string, keySet bool, cause error) error {
	if !keySet {
		return fmt.Errorf("%s: the gateway needs a tenant's API key and $%s is not set: export %s=<key> "+
			"(deploy/examples/local.yaml's key is local-dev-key), or name another variable with --api-key-env (%v)",
			cmd, keyEnv, keyEnv, cause)
	}
	return fmt.Errorf("%s: the gateway refused the API key in $%s: it is no tenant's key there (%v)", cmd, keyEnv, cause)
}

// benchFailures is the error bench exits with once its report is printed:
// nil when every request was answered, else how many failed and how, so a
// script or test sees the failure and its reason without parsing the report.
func benchFailures(rep *loadgen.BenchReport) error {
	targets := []loadgen.TargetReport{rep.Gateway}
	if rep.Direct != nil {
		targets = append(targets, *rep.Direct)
	}
	var failed, requests int
	var how []string
	for _, t := range targets {
		failed += t.Errors
		requests += t.Requests
		for _, kind := range slices.Sorted(maps.Keys(t.ErrorsByKind)) {
			how = append(how, fmt.Sprintf("%s: %d × %s", t.Name, t.ErrorsByKind[kind], kind))
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("bench: %d of %d requests failed (%s); the report above has the details", failed, requests, strings.Join(how, "; "))
}
