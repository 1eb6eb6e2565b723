package main

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func newFakeLLMCmd() *cobra.Command {
	var (
		flags   processFlags
		listen  string
		cfg     fakellm.Options
		instant int
		first   time.Duration
		timings int
		limits  realTimeLimits
		style   string
		brk     string
	)
	cmd := &cobra.Command{
		Use:   "fakellm [--listen ADDR] [--workload NAME | --instant N [--first-token D]] [--timings N] [--seed S] [--time-scale X] [--route N] [--open-early] [--continuation STYLE] [--break-after N --break-share F --break-mode MODE [--break-stall-for D]]",
		Short: "Serve a simulated LLM route: OpenAI chat, Responses and embeddings, Anthropic Messages",
		Long: `fakellm plays one route of a seeded workload model (the simulator's, as hedgerow simulate plays it) in real time:
POST /v1/chat/completions, POST /v1/responses and POST /v1/messages (Anthropic), each streaming or
not, POST /v1/embeddings, GET /v1/models, GET /stats and GET /healthz.
Every route of one run must share --workload and --seed and play a different --route, so a
hedged duplicate draws the same answer with its own latency. --time-scale is real seconds per
model second (0.1 runs the model ten times faster than real time). --open-early opens every
stream at once, as real providers do, and sends its first token at the drawn first byte.
--requests-per-minute and --tokens-per-minute enforce a provider key's limits in real time:
past them the route answers 429 with Retry-After, as a provider does.

An answer's text is a function of the conversation alone, its length of the conversation and
max_tokens: the same whatever --seed, --route or stream (timing and faults still follow them).
--continuation lets the route finish an answer from any prefix of that text, sent back as the
final assistant message, and answer exactly the rest (a partial that is not a prefix is refused
400; a continuation's max_tokens counts only the new tokens):
  prefill                 Anthropic Messages: a final assistant message (no trailing whitespace)
  continue_final_message  vLLM/SGLang chat: "continue_final_message": true with
                          "add_generation_prompt": false
  prefix                  DeepSeek chat: a final assistant message with "prefix": true
A route refuses another style's continuation with 400; with none (the default) it behaves as
before. --break-share F --break-after N breaks a share F of streaming answers longer than N
tokens (drawn per request from --seed and --route) right after their Nth content token:
--break-mode cut closes the connection, error sends the API's in-band error event, stall goes
silent until the client leaves — or, with --break-stall-for D (model time, like every time of
the fake: D × --time-scale of real time), for D, after which the stream resumes and completes
normally with the same text (0, the default: until the client leaves; refused with another
mode); malformed sends one event whose data is not JSON and ends the body; truncate ends the
stream normally but early, as an answer cut at its length limit (finish_reason length,
Responses' incomplete max_output_tokens, Anthropic's stop_reason max_tokens) with the usage of
the tokens sent. Continuations never break.

--instant N answers every request at once with exactly N tokens, never failing: a route with no
latency of its own, for measuring what lies in front of it (hedgerow bench --compare-direct, make
bench-path); --first-token D delays its first byte by D (real time), a slow route to race a hedge
against. --timings N keeps the last N requests' moments to the microsecond — arrival, first byte
written, client gone, end — and serves them at GET /timings?since=SEQ, which is how make bench-path
measures a cancel as the provider sees it (GET /stats keeps them to the millisecond).

Workloads: ` + strings.Join(workload.Names(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := flags.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("instant") {
				if cfg.Model, err = instantModel(instant, first, cfg.TimeScale); err != nil {
					return err
				}
				cfg.Workload = fakellm.InstantName
			} else if first != 0 {
				return errors.New("--first-token: only with --instant")
			}
			if cfg.RateLimit, err = limits.inModelTime(cfg.TimeScale); err != nil {
				return err
			}
			if cfg.Continuation, err = fakellm.ParseContinuation(style); err != nil {
				return fmt.Errorf("--continuation: %w", err)
			}
			if cfg.BreakMode, err = fakellm.ParseBreakMode(brk); err != nil {
				return fmt.Errorf("--break-mode: %w", err)
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			f, err := node.StartFakeLLMWith(listen, cfg, node.FakeLLMOptions{Timings: timings}, log)
			if err != nil {
				return err
			}
			log.Info("fakellm serving", "http", "http://"+f.Addr().String(), "workload", cfg.Workload,
				"route", cfg.Route, "seed", cfg.Seed, "time_scale", cfg.TimeScale, "open_early", cfg.OpenEarly,
				"continuation", cfg.Continuation, "break_share", cfg.BreakShare, "break_after", cfg.BreakAfter, "break_mode", cfg.BreakMode,
				"break_stall_for", cfg.BreakStallFor)
			return flags.runUntilDone(ctx, f, log)
		},
	}
	flags.add(cmd, false)
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:9101", "address to listen on")
	f.StringVar(&cfg.Workload, "workload", workload.GPT4o, "workload model: "+strings.Join(workload.Names(), ", "))
	f.Uint64Var(&cfg.Seed, "seed", 1, "workload seed, shared by every route of a run")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "real seconds per model second")
	f.IntVar(&cfg.Route, "route", 0, "which route of the model to play (0..2)")
	f.StringVar(&cfg.ModelID, "model", "", "model id /v1/models lists (default: the workload's name)")
	f.BoolVar(&cfg.OpenEarly, "open-early", false, "open streams at once (headers, the empty role chunk or message_start and ping) and send the first token at the drawn first byte")
	f.IntVar(&instant, "instant", 0, "instead of --workload, answer every request at once, never failing, with exactly N tokens (for hedgerow bench --compare-direct)")
	f.DurationVar(&first, "first-token", 0, "with --instant, send the first byte this long (real time) after each request arrives")
	f.IntVar(&timings, "timings", 0, "keep the last N requests' moments to the microsecond and serve them at GET /timings (0: none)")
	f.IntVar(&limits.requests, "requests-per-minute", 0, "requests a real minute the route admits before it answers 429 (0: no limit)")
	f.IntVar(&limits.tokens, "tokens-per-minute", 0, "input and output tokens a real minute the route admits before it answers 429 (0: no limit)")
	f.StringVar(&style, "continuation", string(fakellm.ContinuationNone), "how the route continues an answer from partial assistant output: none, prefill, continue_final_message or prefix")
	f.Float64Var(&cfg.BreakShare, "break-share", 0, "share of streaming answers broken after --break-after tokens, in [0, 1]")
	f.IntVar(&cfg.BreakAfter, "break-after", 0, "content tokens a broken stream sends before it breaks")
	f.StringVar(&brk, "break-mode", string(fakellm.BreakCut), "how a broken stream fails: cut, error, stall, malformed (one event that is not JSON, then the end) or truncate (a normal end at the length limit, finish length)")
	f.DurationVar(&cfg.BreakStallFor, "break-stall-for", 0, "with --break-mode stall, how long (model time) a stalled stream stays silent before it resumes and completes; 0: until the client leaves")
	return cmd
}

// realTimeLimits are a provider key's limits per real minute, as
// --requests-per-minute and --tokens-per-minute give them.
type realTimeLimits struct{ requests, tokens int }

// inModelTime converts the limits to the fake's model time: a model minute
// lasts timeScale real minutes, so it admits timeScale times the real
// minute's limit, which must come out whole. The bucket holds a model
// minute's worth: at --time-scale 1 a provider's burst, at 0.1 a tenth of it.
func (l realTimeLimits) inModelTime(timeScale float64) (workload.RateLimit, error) {
	convert := func(flag string, perRealMinute int) (int, error) {
		if perRealMinute < 0 {
			return 0, fmt.Errorf("--%s %d: must be ≥ 0", flag, perRealMinute)
		}
		perModelMinute := float64(perRealMinute) * timeScale
		if perRealMinute > 0 && (perModelMinute < 1 || perModelMinute != math.Trunc(perModelMinute)) {
			return 0, fmt.Errorf("--%s %d at --time-scale %v is %v a model minute: pick a limit the time scale turns into a whole number", flag, perRealMinute, timeScale, perModelMinute)
		}
		return int(perModelMinute), nil
	}
	rpm, err := convert("requests-per-minute", l.requests)
	if err != nil {
		return workload.RateLimit{}, err
	}
	tpm, err := convert("tokens-per-minute", l.tokens)
	return workload.RateLimit{RPM: rpm, TPM: tpm}, err
}

// instantModel is fakellm.InstantModel(tokens) whose first byte comes
// first (real time, whatever timeScale) after the request arrives (0: at
// once, as the instant model's): the slow route make bench-path races a
// hedge against. Its tokens still follow the first at once, and nothing
// fails, stalls or hangs.
func instantModel(tokens int, first time.Duration, timeScale float64) (*workload.Model, error) {
	m, err := fakellm.InstantModel(tokens)
	if err != nil || first == 0 {
		return m, err
	}
	if first < 0 || !(timeScale > 0) {
		return nil, fmt.Errorf("--first-token %v at --time-scale %v: want a positive duration and time scale", first, timeScale)
	}
	at := workload.LogNormalMedian(first.Seconds()/timeScale, 0) // the model's seconds
	m.TTFT.Main, m.TTFT.Stall = at, at
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("--first-token %v: %w", first, err)
	}
	return m, nil
}
