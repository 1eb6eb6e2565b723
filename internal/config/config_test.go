package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// minimal is the smallest valid configuration; tests append sections to it.
const minimal = `routes:
  - name: a
    provider: openai
    base_url: http://127.0.0.1:9101
    model: m
  - name: b
    provider: anthropic
    base_url: http://127.0.0.1:9102
    model: m
pools:
  general:
    routes: [a, b]
`

func noEnv(string) (string, bool) { return "", false }

func envOf(vars map[string]string) LookupEnv {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// parse loads src as test.yaml and returns its problems (nil when valid).
func parse(t *testing.T, src string, role Role, env LookupEnv) (*Config, Problems) {
	t.Helper()
	c, err := Parse("test.yaml", []byte(src), role, env)
	if err == nil {
		return c, nil
	}
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse error is %T (%v), want Problems", err, err)
	}
	if c != nil {
		t.Fatalf("Parse returned a config together with problems")
	}
	return nil, ps
}

// wantProblem fails unless ps has a problem at path whose message contains msg.
func wantProblem(t *testing.T, ps Problems, path, msg string) Problem {
	t.Helper()
	for _, p := range ps {
		if p.Path == path && strings.Contains(p.Message, msg) {
			return p
		}
	}
	t.Fatalf("no problem at %s containing %q; got:\n%v", path, msg, ps)
	return Problem{}
}

func wantNoProblems(t *testing.T, ps Problems) {
	t.Helper()
	if len(ps) > 0 {
		t.Fatalf("want no problems, got:\n%v", ps)
	}
}

func TestMinimalConfigLoadsForServe(t *testing.T) {
	_, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
}

func TestProblemNamesFileLineAndPath(t *testing.T) {
	src := minimal + `policies:
  default:
    delay:
      quantile: 1.2
`
	_, ps := parse(t, src, RoleServe, noEnv)
	if len(ps) != 1 {
		t.Fatalf("want exactly one problem, got:\n%v", ps)
	}
	const want = "test.yaml:16: policies.default.delay.quantile: 1.2 is outside (0,1)"
	if got := ps[0].String(); got != want {
		t.Fatalf("problem = %q, want %q", got, want)
	}
	if ps.Error() != want {
		t.Fatalf("Problems.Error() = %q, want %q", ps.Error(), want)
	}
}

func TestUnknownKeyIsAProblemAnywhere(t *testing.T) {
	cases := []struct {
		name, src, path string
	}{
		{"top level", minimal + "metrics: {}\n", "metrics"},
		{"in a section", minimal + "http:\n  listn: 127.0.0.1:1\n", "http.listn"},
		{"in a list item", strings.Replace(minimal, "    model: m\n", "    model: m\n    modle: x\n", 1), "routes[0].modle"},
		{"in a pool contract", minimal + "    contract: {required: [x]}\n", "pools.general.contract.required"},
		{"deep in a policy", minimal + "policies:\n  default:\n    delay:\n      qantile: 0.9\n", "policies.default.delay.qantile"},
		{"in a tenant", minimal + "tenants:\n  t:\n    api_keys: [k]\n", "tenants.t.api_keys"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			p := wantProblem(t, ps, tc.path, "unknown key")
			if p.Line == 0 {
				t.Fatalf("unknown key problem has no line: %v", p)
			}
		})
	}
}

func TestRetiredDuplicateBucketKeysSayWhatReplacedThem(t *testing.T) {
	cases := []struct{ key, why, hint string }{
		{"capacity", "sliding window", "duplicate_rate.window"},
		{"initial_fill", "sliding window", "duplicate_rate.reserve"},
		{"pool_floor", "became its reserve", "duplicate_rate.reserve: {burst"},
		{"pool_floor_refill", "became its reserve", "per_minute"},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			src := minimal + "policies:\n  default:\n    duplicate_rate:\n      " + tc.key + ": 4\n"
			_, ps := parse(t, src, RoleServe, noEnv)
			p := wantProblem(t, ps, "policies.default.duplicate_rate."+tc.key, "was removed")
			if !strings.Contains(p.Message, tc.why) || !strings.Contains(p.Message, tc.hint) || p.Line != 16 {
				t.Fatalf("problem %v at line %d: want line 16, saying %q and naming %s", p, p.Line, tc.why, tc.hint)
			}
		})
	}
}

func TestDuplicateRateWindowIsChecked(t *testing.T) {
	for _, tc := range []struct{ window, msg string }{
		{"500ms", "outside [1s, 1h]"},
		{"2h", "outside [1s, 1h]"},
	} {
		src := minimal + "policies:\n  default:\n    duplicate_rate: {window: " + tc.window + "}\n"
		_, ps := parse(t, src, RoleServe, noEnv)
		wantProblem(t, ps, "policies.default.duplicate_rate.window", tc.msg)
	}
	src := minimal + "policies:\n  default:\n    duplicate_rate: {window: 30s, replacement_reserve: 2}\n"
	cfg, ps := parse(t, src, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if d := cfg.PolicyFor("default").DuplicateCeiling(); d.Window != 30*time.Second || d.ReplacementReserve != 2 || d.Ceiling != 0.08 {
		t.Fatalf("duplicate ceiling %+v, want the window and reserve set and the default ceiling", d)
	}
}

func TestDuplicateRateBurstWindowIsChecked(t *testing.T) {
	for _, tc := range []struct{ name, rate, key, msg string }{
		{"under a second", "{burst_window: 500ms}", "burst_window", "below 1s"},
		{"window not a whole number of its tenths", "{window: 1m, burst_window: 7s}", "burst_window", "whole number of tenths"},
		{"more than 100 counters", "{window: 1h, burst_window: 10s}", "burst_window", "at most 100"},
		{"burst ceiling negative", "{burst_ceiling: -0.1}", "burst_ceiling", "outside [0, 1]"},
		{"burst ceiling over 1", "{burst_ceiling: 1.5}", "burst_ceiling", "outside [0, 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := minimal + "policies:\n  default:\n    duplicate_rate: " + tc.rate + "\n"
			_, ps := parse(t, src, RoleServe, noEnv)
			wantProblem(t, ps, "policies.default.duplicate_rate."+tc.key, tc.msg)
		})
	}
	t.Run("the default keeps a minute of one-second counters and bounds their last ten", func(t *testing.T) {
		cfg, ps := parse(t, minimal, RoleServe, noEnv)
		wantNoProblems(t, ps)
		d := cfg.PolicyFor("default").DuplicateCeiling()
		if d.Window != time.Minute || d.Slots != 60 || d.SlotLength() != time.Second || d.BurstSlots != 10 || d.BurstCeiling != 0.16 {
			t.Fatalf("duplicate ceiling %+v, want a 1m window of 60 slots, the last 10 bounded at 0.16", d)
		}
	})
	t.Run("a ceiling above the burst ceiling raises it", func(t *testing.T) {
		cfg, ps := parse(t, minimal+"policies:\n  default:\n    duplicate_rate: {ceiling: 1}\n", RoleServe, noEnv)
		wantNoProblems(t, ps)
		if d := cfg.PolicyFor("default").DuplicateCeiling(); d.BurstCeiling != 1 {
			t.Fatalf("duplicate ceiling %+v, want the burst ceiling raised to the ceiling 1", d)
		}
	})
	t.Run("burst_window 0 turns the burst bound off", func(t *testing.T) {
		cfg, ps := parse(t, minimal+"policies:\n  default:\n    duplicate_rate: {window: 10s, burst_window: 0s}\n", RoleServe, noEnv)
		wantNoProblems(t, ps)
		if d := cfg.PolicyFor("default").DuplicateCeiling(); d.BurstSlots != 0 || d.Slots != 10 {
			t.Fatalf("duplicate ceiling %+v, want 10 slots and no burst bound", d)
		}
	})
}

func TestPoolNamingMissingRouteIsAProblem(t *testing.T) {
	src := strings.Replace(minimal, "routes: [a, b]", "routes: [a, z]", 1)
	_, ps := parse(t, src, RoleServe, noEnv)
	p := wantProblem(t, ps, "pools.general.routes[1]", `no route is named "z"`)
	if p.Line != 12 {
		t.Fatalf("line = %d, want 12", p.Line)
	}
}

func TestRouteAndPoolNamesMustBeSubjectTokens(t *testing.T) {
	cases := []struct {
		name, src, path string
	}{
		{"route with a dot", strings.Replace(minimal, "name: a", "name: a.b", 1), "routes[0].name"},
		{"route in capitals", strings.Replace(minimal, "name: a", "name: A", 1), "routes[0].name"},
		{"route with a space", strings.Replace(minimal, "name: a", "name: 'a b'", 1), "routes[0].name"},
		{"route without a name", strings.Replace(minimal, "name: a", "name: ''", 1), "routes[0].name"},
		{"pool with a wildcard", strings.Replace(minimal, "  general:", "  gen*:", 1), "pools.gen*"},
		{"pool with a greater-than", strings.Replace(minimal, "  general:", "  'gen>':", 1), "pools.gen>"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			wantProblem(t, ps, tc.path, "[a-z0-9_-]+")
		})
	}
}

func TestDelayQuantileMustBeInsideOpenUnitInterval(t *testing.T) {
	for _, q := range []string{"0", "1", "1.2", "-0.5", ".nan"} {
		t.Run(q, func(t *testing.T) {
			_, ps := parse(t, minimal+"policies:\n  default:\n    delay: {quantile: "+q+"}\n", RoleServe, noEnv)
			wantProblem(t, ps, "policies.default.delay.quantile", "outside (0,1)")
		})
	}
	_, ps := parse(t, minimal+"policies:\n  default:\n    delay: {quantile: 0.5}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
}

func TestMinDelayAboveMaxDelayIsAProblem(t *testing.T) {
	_, ps := parse(t, minimal+"policies:\n  default:\n    delay: {min: 2s, max: 1s}\n", RoleServe, noEnv)
	wantProblem(t, ps, "policies.default.delay.min", "greater than delay.max 1s")

	_, ps = parse(t, minimal+"policies:\n  default:\n    delay: {min: 1s, max: 1s, initial: 1s}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
}

func TestInitialDelayMustLieBetweenMinAndMax(t *testing.T) {
	_, ps := parse(t, minimal+"policies:\n  default:\n    delay: {min: 100ms, max: 2s, initial: 5s}\n", RoleServe, noEnv)
	wantProblem(t, ps, "policies.default.delay.initial", "outside delay.min..delay.max")
}

func TestStallAfterFirstTokenDefaultsToTwoSecondsAndMustBePositive(t *testing.T) {
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Policies["default"].StallAfterFirstToken; got != 2*time.Second {
		t.Errorf("default stall_after_first_token %v, want 2s", got)
	}
	_, ps = parse(t, minimal+"policies:\n  default:\n    stall_after_first_token: 0s\n", RoleServe, noEnv)
	wantProblem(t, ps, "policies.default.stall_after_first_token", "must be positive")
	cfg, ps = parse(t, minimal+"policies:\n  default:\n    stall_after_first_token: 5s\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Policies["default"].StallAfterFirstToken; got != 5*time.Second {
		t.Errorf("configured stall_after_first_token %v, want 5s", got)
	}
}

// The stall bound a cohort derives from its inter-token gaps lies in
// [stall_floor, stall_after_first_token] (docs/architecture.md §4 rule 4):
// the floor defaults to 500ms, follows a smaller cap when left to its
// default, and must be positive and at most the cap; equal, it pins the
// bound.
func TestStallFloorDefaultsTo500msAndLiesWithinTheCap(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       time.Duration // the floor, when the file loads
		problem    string        // else the problem at policies.default.stall_floor
	}{
		{"the default", "", 500 * time.Millisecond, ""},
		{"configured", "stall_floor: 100ms", 100 * time.Millisecond, ""},
		{"equal to the cap pins the bound", "stall_floor: 2s", 2 * time.Second, ""},
		{"a default floor follows a smaller cap", "stall_after_first_token: 300ms", 300 * time.Millisecond, ""},
		{"zero", "stall_floor: 0s", 0, "must be positive"},
		{"negative", "stall_floor: -1s", 0, "must be positive"},
		{"above the cap", "stall_after_first_token: 1s\n    stall_floor: 1500ms", 0, "greater than stall_after_first_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := minimal
			if tc.yaml != "" {
				src += "policies:\n  default:\n    " + tc.yaml + "\n"
			}
			cfg, ps := parse(t, src, RoleServe, noEnv)
			if tc.problem != "" {
				wantProblem(t, ps, "policies.default.stall_floor", tc.problem)
				return
			}
			wantNoProblems(t, ps)
			if got := cfg.Policies["default"].StallFloor; got != tc.want {
				t.Fatalf("stall_floor %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMaxAttemptsMustBeBetweenOneAndFour(t *testing.T) {
	cases := []struct {
		value string
		ok    bool
	}{{"0", false}, {"-1", false}, {"1", true}, {"4", true}, {"5", false}}
	for _, tc := range cases {
		t.Run(tc.value, func(t *testing.T) {
			_, ps := parse(t, minimal+"policies:\n  default:\n    max_attempts: "+tc.value+"\n", RoleServe, noEnv)
			if tc.ok {
				wantNoProblems(t, ps)
				return
			}
			wantProblem(t, ps, "policies.default.max_attempts", "outside [1,4]")
		})
	}
}

func TestRolloutAndControlFractionsMustBeInUnitInterval(t *testing.T) {
	cases := []struct {
		key, value string
		ok         bool
	}{
		{"rollout_fraction", "0", true},
		{"rollout_fraction", "1", true},
		{"rollout_fraction", "1.5", false},
		{"rollout_fraction", "-0.1", false},
		{"control_fraction", "0", true},
		{"control_fraction", "0.5", true},
		{"control_fraction", "2", false},
		{"control_fraction", "-1", false},
	}
	for _, tc := range cases {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			_, ps := parse(t, minimal+"policies:\n  default:\n    "+tc.key+": "+tc.value+"\n", RoleServe, noEnv)
			if tc.ok {
				wantNoProblems(t, ps)
				return
			}
			wantProblem(t, ps, "policies.default."+tc.key, "outside [0,1]")
		})
	}
}

func TestSecretEnvIsRequiredOnlyByRolesThatUseIt(t *testing.T) {
	withKey := strings.Replace(minimal, "    model: m\n", "    model: m\n    api_key_env: ROUTE_A_KEY\n", 1) +
		"nats:\n  urls: [nats://127.0.0.1:4222]\n"
	withRedis := minimal + "nats:\n  urls: [nats://127.0.0.1:4222]\n" +
		"redis:\n  url: redis://127.0.0.1:6379\n  password_env: REDIS_PASSWORD\n  hash_key_env: HASH_KEY\n"
	withRedisNoHashKey := minimal + "nats:\n  urls: [nats://127.0.0.1:4222]\n" +
		"redis:\n  url: redis://127.0.0.1:6379\n  password_env: REDIS_PASSWORD\n"
	withRedisPasswordButNoURL := minimal + "nats:\n  urls: [nats://127.0.0.1:4222]\n" +
		"redis:\n  password_env: REDIS_PASSWORD\n"

	cases := []struct {
		name string
		src  string
		role Role
		env  map[string]string
		path string // empty: no problem expected
	}{
		{"worker needs the route key", withKey, RoleWorker, nil, "routes[0].api_key_env"},
		{"serve needs the route key", withKey, RoleServe, nil, "routes[0].api_key_env"},
		{"an empty route key counts as missing", withKey, RoleWorker, map[string]string{"ROUTE_A_KEY": ""}, "routes[0].api_key_env"},
		{"gateway never needs the route key", withKey, RoleGateway, nil, ""},
		{"worker with the route key set", withKey, RoleWorker, map[string]string{"ROUTE_A_KEY": "k"}, ""},
		{"gateway needs the redis password", withRedis, RoleGateway, map[string]string{"HASH_KEY": "shared-hash-key-7f3a"}, "redis.password_env"},
		{"serve needs the redis password", withRedis, RoleServe, map[string]string{"HASH_KEY": "shared-hash-key-7f3a"}, "redis.password_env"},
		{"gateway needs the shared hash key", withRedis, RoleGateway, map[string]string{"REDIS_PASSWORD": "p"}, "redis.hash_key_env"},
		{"worker needs the redis password for its route leases", withRedis, RoleWorker, map[string]string{"HASH_KEY": ""}, "redis.password_env"},
		{"worker does not need the shared hash key", withRedis, RoleWorker, map[string]string{"REDIS_PASSWORD": "p"}, ""},
		{"worker without hash_key_env at all", withRedisNoHashKey, RoleWorker, map[string]string{"REDIS_PASSWORD": "p"}, ""},
		{"gateway with the redis password and hash key set", withRedis, RoleGateway, map[string]string{"REDIS_PASSWORD": "p", "HASH_KEY": "shared-hash-key-7f3a"}, ""},
		{"no redis url means no redis password needed", withRedisPasswordButNoURL, RoleServe, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, tc.role, envOf(tc.env))
			if tc.path == "" {
				wantNoProblems(t, ps)
				return
			}
			p := wantProblem(t, ps, tc.path, "is not set")
			for _, v := range tc.env {
				if v != "" && strings.Contains(p.Message, v) {
					t.Fatalf("problem %q reveals a secret value", p)
				}
			}
		})
	}
}

func TestHashKeyIsRequiredWithRedisOnlyByRolesThatHashUserActions(t *testing.T) {
	noHashKey := minimal + "nats:\n  urls: [nats://127.0.0.1:4222]\n" + "redis:\n  url: redis://127.0.0.1:6379\n"
	cases := []struct {
		role     Role
		required bool
	}{
		{RoleServe, true},
		{RoleGateway, true},
		{RoleWorker, false}, // its Redis holds route leases; it never hashes an Idempotency-Key
	}
	for _, tc := range cases {
		t.Run(string(tc.role), func(t *testing.T) {
			_, ps := parse(t, noHashKey, tc.role, noEnv)
			if !tc.required {
				wantNoProblems(t, ps)
				return
			}
			wantProblem(t, ps, "redis.hash_key_env", "required with redis.url")
		})
	}
}

func TestSecretEnvNameMustBeAVariableName(t *testing.T) {
	src := strings.Replace(minimal, "    model: m\n", "    model: m\n    api_key_env: sk-live-123\n", 1)
	_, ps := parse(t, src, RoleGateway, noEnv)
	wantProblem(t, ps, "routes[0].api_key_env", "not an environment variable name")
}

func TestExternalNATSIsRequiredForGatewayAndWorker(t *testing.T) {
	for _, role := range []Role{RoleGateway, RoleWorker} {
		_, ps := parse(t, minimal, role, noEnv)
		wantProblem(t, ps, "nats.urls", "at least one URL")
	}
	_, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
}

func TestBadDurationIsAProblem(t *testing.T) {
	for _, v := range []string{"fast", "30", "[1s]"} {
		t.Run(v, func(t *testing.T) {
			_, ps := parse(t, minimal+"policies:\n  default:\n    deadline: "+v+"\n", RoleServe, noEnv)
			wantProblem(t, ps, "policies.default.deadline", "duration")
		})
	}
}

func TestDecodeProblemIsReportedOnceWithoutFollowOnProblems(t *testing.T) {
	_, ps := parse(t, minimal+"policies:\n  default:\n    deadline: soon\n", RoleServe, noEnv)
	if len(ps) != 1 {
		t.Fatalf("want only the decode problem, got:\n%v", ps)
	}
}

func TestUnknownProviderIsAProblem(t *testing.T) {
	_, ps := parse(t, strings.Replace(minimal, "provider: openai", "provider: azure", 1), RoleServe, noEnv)
	wantProblem(t, ps, "routes[0].provider", `"azure": want openai or anthropic`)
}

func TestBadCommitPointIsAProblem(t *testing.T) {
	for _, v := range []string{"tokens:0", "tokens:x", "last_token"} {
		t.Run(v, func(t *testing.T) {
			_, ps := parse(t, minimal+"policies:\n  default:\n    commit_point: "+v+"\n", RoleServe, noEnv)
			wantProblem(t, ps, "policies.default.commit_point", "commit point")
		})
	}
	c, ps := parse(t, minimal+"policies:\n  default:\n    commit_point: tokens:16\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := c.Policies["default"].CommitPoint; got != (schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 16}) {
		t.Fatalf("commit point = %v, want tokens:16", got)
	}
}

func TestBadTriggerIsAProblem(t *testing.T) {
	_, ps := parse(t, minimal+"policies:\n  default:\n    trigger: ttfb\n", RoleServe, noEnv)
	wantProblem(t, ps, "policies.default.trigger", "want first_byte or total")
}

func TestDuplicateRouteNameIsAProblem(t *testing.T) {
	_, ps := parse(t, strings.Replace(minimal, "name: b", "name: a", 1), RoleServe, noEnv)
	wantProblem(t, ps, "routes[1].name", `"a" is already the name of routes[0]`)
}

func TestDuplicateMappingKeyIsAProblem(t *testing.T) {
	_, ps := parse(t, minimal+"http:\n  listen: 127.0.0.1:1\n  listen: 127.0.0.1:2\n", RoleServe, noEnv)
	wantProblem(t, ps, "http.listen", "appears more than once")
}

func TestBodyLimitOverMaxPayloadIsAProblem(t *testing.T) {
	cases := []struct {
		name, src string
		ok        bool
	}{
		{"over the payload", "nats: {max_payload: 1MiB}\nhttp: {body_limit: 2MiB}\n", false},
		{"eats the headroom", "nats: {max_payload: 1MiB}\nhttp: {body_limit: 1MiB}\n", false},
		{"leaves the headroom", "nats: {max_payload: 1MiB}\nhttp: {body_limit: 960KiB}\n", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, minimal+tc.src, RoleServe, noEnv)
			if tc.ok {
				wantNoProblems(t, ps)
				return
			}
			wantProblem(t, ps, "http.body_limit", "must fit in nats.max_payload")
		})
	}
}

func TestIdempotencyBoundsMustBePositiveAndConsistent(t *testing.T) {
	_, ps := parse(t, minimal+"http: {idempotency: {ttl: 0s}}\n", RoleServe, noEnv)
	wantProblem(t, ps, "http.idempotency.ttl", "is not positive")
	_, ps = parse(t, minimal+"http: {idempotency: {max_entry_bytes: 2MiB, max_total_bytes: 1MiB}}\n", RoleServe, noEnv)
	wantProblem(t, ps, "http.idempotency.max_entry_bytes", "at most http.idempotency.max_total_bytes")
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if id := cfg.HTTP.Idempotency; id.TTL != 24*time.Hour || id.MaxEntryBytes != 4<<20 || id.MaxTotalBytes != 256<<20 {
		t.Fatalf("defaults %+v", id)
	}
}

func TestWriteTimeoutShorterThanADeadlineIsAProblem(t *testing.T) {
	_, ps := parse(t, minimal+"http: {write_timeout: 10s}\n", RoleServe, noEnv)
	wantProblem(t, ps, "http.write_timeout", "policies.default.deadline 30s")
}

func TestHedgingNeedsAnIdempotentClass(t *testing.T) {
	_, ps := parse(t, minimal+"policies:\n  writes:\n    idempotent: false\n", RoleServe, noEnv)
	wantProblem(t, ps, "policies.writes.idempotent", "only idempotent operation classes may hedge")

	_, ps = parse(t, minimal+"policies:\n  writes:\n    idempotent: false\n    hedge: false\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
}

func TestTenantKeysMustBeHashesAndAreNeverEchoed(t *testing.T) {
	const plaintext = "sk-very-secret"
	_, ps := parse(t, minimal+"tenants:\n  acme:\n    api_key_hashes: ["+plaintext+"]\n", RoleGateway, noEnv)
	p := wantProblem(t, ps, "tenants.acme.api_key_hashes[0]", "sha256")
	if strings.Contains(p.String(), plaintext) {
		t.Fatalf("problem %q echoes the key", p)
	}
}

func TestOneKeyHashMayBelongToOneTenantOnly(t *testing.T) {
	h := HashAPIKey("k")
	src := minimal + "tenants:\n  a:\n    api_key_hashes: [" + h + "]\n  b:\n    api_key_hashes: [" + h + "]\n"
	_, ps := parse(t, src, RoleServe, noEnv)
	wantProblem(t, ps, "tenants.b.api_key_hashes[0]", `already a key of tenant "a"`)
}

func TestTenantRequestLimitsMustBeNonNegativeAndABurstNeedsARate(t *testing.T) {
	h := HashAPIKey("k")
	tenant := func(limits string) string {
		return minimal + "tenants:\n  acme:\n    api_key_hashes: [" + h + "]\n" + limits
	}
	tests := []struct{ name, limits, path, msg string }{
		{"a negative rate", "    requests_per_second: -1\n", "tenants.acme.requests_per_second", "finite number"},
		{"a negative burst", "    requests_per_second: 1\n    burst: -2\n", "tenants.acme.burst", "negative"},
		{"a burst with no rate", "    burst: 5\n", "tenants.acme.burst", "needs requests_per_second"},
		{"a negative concurrency", "    max_concurrent: -1\n", "tenants.acme.max_concurrent", "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tenant(tc.limits), RoleGateway, noEnv)
			wantProblem(t, ps, tc.path, tc.msg)
		})
	}
	c, ps := parse(t, tenant("    requests_per_second: 2.5\n    burst: 10\n    max_concurrent: 4\n"), RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := c.Tenants["acme"]; got.RequestsPerSecond != 2.5 || got.Burst != 10 || got.MaxConcurrent != 4 {
		t.Fatalf("tenant limits %+v, want 2.5/s, burst 10, 4 in flight", got)
	}
}

// routes[].limits are a provider key's published limits: whole numbers
// of requests and tokens a minute, zero or absent for none.
func TestRouteLimitsAreWholeNonNegativeNumbersAndZeroIsNone(t *testing.T) {
	withLimits := func(limits string) string {
		return strings.Replace(minimal, "    model: m\n", "    model: m\n    limits: "+limits+"\n", 1)
	}
	tests := []struct{ name, limits, path, msg string }{
		{"negative requests", "{requests_per_minute: -1}", "routes[0].limits.requests_per_minute", "negative"},
		{"negative tokens", "{tokens_per_minute: -5}", "routes[0].limits.tokens_per_minute", "negative"},
		{"fractional requests", "{requests_per_minute: 1.5}", "routes[0].limits.requests_per_minute", "want an integer"},
		{"fractional tokens", "{tokens_per_minute: 2.5e3}", "routes[0].limits.tokens_per_minute", "want an integer"},
		{"a string", "{requests_per_minute: lots}", "routes[0].limits.requests_per_minute", "want an integer"},
		{"a duration", "{requests_per_minute: 1m}", "routes[0].limits.requests_per_minute", "want an integer"},
		{"over the bound", "{tokens_per_minute: 1125899906842625}", "routes[0].limits.tokens_per_minute", "over 1125899906842624"},
		{"an unknown key", "{requests_per_second: 5}", "routes[0].limits.requests_per_second", ""},
		{"not a mapping", "600", "routes[0].limits", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, withLimits(tc.limits), RoleServe, noEnv)
			wantProblem(t, ps, tc.path, tc.msg)
		})
	}
	for _, tc := range []struct {
		limits string
		want   RouteLimits
	}{
		{"{requests_per_minute: 600, tokens_per_minute: 150000}", RouteLimits{RequestsPerMinute: 600, TokensPerMinute: 150000}},
		{"{requests_per_minute: 600}", RouteLimits{RequestsPerMinute: 600}},
		{"{requests_per_minute: 0, tokens_per_minute: 0}", RouteLimits{}},
		{"{}", RouteLimits{}},
	} {
		c, ps := parse(t, withLimits(tc.limits), RoleServe, noEnv)
		wantNoProblems(t, ps)
		if got := c.Routes[0].Limits; got != tc.want || got.IsZero() != (tc.want == RouteLimits{}) {
			t.Errorf("limits %s: got %+v, want %+v", tc.limits, got, tc.want)
		}
		if got := c.Routes[1].Limits; !got.IsZero() {
			t.Errorf("route b, which sets no limits, has %+v", got)
		}
	}
}

func TestEveryProblemIsReportedInOnePassSortedByLine(t *testing.T) {
	src := `nats:
  max_payload: 1MiB
routes:
  - name: A
    provider: azure
    base_url: 127.0.0.1
    model: m
pools:
  general:
    routes: [nope]
policies:
  default:
    max_attempts: 9
    delay: {quantile: 2}
    bogus: 1
`
	_, ps := parse(t, src, RoleServe, noEnv)
	for _, path := range []string{
		"routes[0].name", "routes[0].provider", "routes[0].base_url", "pools.general.routes[0]",
		"policies.default.max_attempts", "policies.default.delay.quantile", "policies.default.bogus",
	} {
		wantProblem(t, ps, path, "")
	}
	for i := 1; i < len(ps); i++ {
		if ps[i].Line < ps[i-1].Line {
			t.Fatalf("problems not sorted by line:\n%v", ps)
		}
	}
}

// A syntax error is reported at the line that breaks the file, not where
// the mapping or list holding it began (yaml.v3's own line: 1 for a
// mis-indented key of a file's first list).
func TestInvalidYAMLIsAProblemAtTheLineThatBreaksIt(t *testing.T) {
	tests := []struct {
		name, src string
		line      int
		msg       string
	}{
		{"a list item's key indented less than its siblings",
			"routes:\n  - name: a\n    provider: openai\n   model: m\n", 4, "check this line's indentation"},
		{"a key indented less than its siblings, between them and their parent",
			"http:\n    listen: 127.0.0.1:8080\n  body_limit: 1MiB\n", 3, "check this line's indentation"},
		{"a key indented less than its sibling, past comments and blank lines",
			"# c\n# c\nhttp:\n  listen: 127.0.0.1:8080\n\npools:\n  general:\n    routes: [a]\n   models: [x]\n", 9, "did not find expected key"},
		{"a key indented more than its siblings",
			"http:\n  listen: 127.0.0.1:8080\n   body_limit: 1MiB\n", 3, "mapping values are not allowed"},
		{"a tab among the spaces", "http:\n  listen: 127.0.0.1:8080\n\tbody_limit: 1MiB\n", 3, "tab character"},
		{"an item's key mis-indented before an unclosed flow list",
			"routes:\n  - name: a\n   bad: [\n", 3, "invalid YAML"},
		{"a multi-line flow list before the mis-indented key",
			"pools:\n  general:\n    routes: [a,\n      b]\n   models: [x]\n", 5, "did not find expected key"},
		{"a key mis-indented under 2,000 lines of its mapping",
			"pools:\n  general:\n" + strings.Repeat("    # a comment\n", 2000) + "    routes: [a]\n   models: [x]\n", 2004, "did not find expected key"},
		{"an unclosed flow list, at the line that opens it",
			"pools:\n  general:\n    routes: [a, b\n    models: [x]\n", 3, "did not find expected ',' or ']'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			if len(ps) != 1 || ps[0].Line != tc.line || !strings.Contains(ps[0].Message, "invalid YAML") ||
				!strings.Contains(ps[0].Message, tc.msg) {
				t.Fatalf("want one invalid YAML problem at line %d saying %q, got:\n%v", tc.line, tc.msg, ps)
			}
		})
	}
}

func TestAnUnknownKeyCloseToAKnownOneSuggestsIt(t *testing.T) {
	tests := []struct {
		name, src, path, suggestion string // suggestion "": none is close, the known keys are listed
	}{
		{"a letter left out", minimal + "policies:\n  default:\n    dealine: 30s\n", "policies.default.dealine", "deadline"},
		{"a letter left out of a list item's key", strings.Replace(minimal, "    model: m\n", "    model: m\n    max_inflght: 4\n", 1),
			"routes[0].max_inflght", "max_inflight"},
		{"two letters swapped", minimal + "http:\n  lsiten: 127.0.0.1:1\n", "http.lsiten", "listen"},
		{"a top-level key in the singular", minimal + "tenant:\n  t: {}\n", "tenant", "tenants"},
		{"camel case for snake case", minimal + "policies:\n  default:\n    maxAttempts: 2\n", "policies.default.maxAttempts", "max_attempts"},
		{"nothing close", minimal + "metrics: {}\n", "metrics", ""},
		{"a key too far from any to be a typo", minimal + "tenants:\n  t:\n    api_keys: [k]\n", "tenants.t.api_keys", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			p := wantProblem(t, ps, tc.path, "unknown key")
			if tc.suggestion == "" {
				if strings.Contains(p.Message, "did you mean") || !strings.Contains(p.Message, "known keys:") {
					t.Fatalf("problem %q: want the known keys listed and no guess", p)
				}
				return
			}
			if want := "did you mean \"" + tc.suggestion + "\"?"; !strings.Contains(p.Message, want) {
				t.Fatalf("problem %q does not say %s", p, want)
			}
		})
	}
}

func TestClosestKeyIsTheNearestWithinATypoOfTheKey(t *testing.T) {
	known := []string{"listen", "body_limit", "read_timeout", "write_timeout"}
	tests := []struct{ unknown, want string }{
		{"listn", "listen"},               // one deletion
		{"body_limt", "body_limit"},       // one deletion
		{"write_timout", "write_timeout"}, // nearer write_timeout than read_timeout
		{"red_timeout", "read_timeout"},   // one insertion
		{"lst", ""},                       // three edits from listen: more than a third of three letters
		{"timeout", ""},                   // five from read_timeout
	}
	for _, tc := range tests {
		if got := closestKey(tc.unknown, known); got != tc.want {
			t.Errorf("closestKey(%q) = %q, want %q", tc.unknown, got, tc.want)
		}
	}
}

// The all-zero hash of the examples in deploy/ loads (the file is valid)
// but lets nobody in: the roles that let callers in warn of it.
func TestThePlaceholderKeyHashIsAWarningNotARefusal(t *testing.T) {
	placeholder := "sha256:" + strings.Repeat("0", 64)
	tenant := func(h string) string { return minimal + "tenants:\n  team:\n    api_key_hashes: [" + h + "]\n" }
	tests := []struct {
		name, src string
		role      Role
		warned    bool
	}{
		{"serve lets callers in", tenant(placeholder), RoleServe, true},
		{"a gateway lets callers in", tenant(placeholder), RoleGateway, true},
		{"a worker lets nobody in", tenant(placeholder), RoleWorker, false},
		{"a real key's hash", tenant(HashAPIKey("k")), RoleServe, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.role.NeedsExternalNATS() {
				tc.src = "nats: {urls: [nats://127.0.0.1:1]}\n" + tc.src
			}
			cfg, ps := parse(t, tc.src, tc.role, noEnv)
			wantNoProblems(t, ps)
			if !tc.warned {
				if len(cfg.Warnings) != 0 {
					t.Fatalf("warnings %v, want none", cfg.Warnings)
				}
				return
			}
			line := strings.Count(tc.src, "\n") // the last line holds the hash
			if len(cfg.Warnings) != 1 {
				t.Fatalf("warnings %v, want one", cfg.Warnings)
			}
			w := cfg.Warnings[0]
			if !w.Warning || w.Path != "tenants.team.api_key_hashes[0]" || w.Line != line ||
				!strings.Contains(w.Message, "placeholder") || !strings.Contains(w.String(), ": warning: ") {
				t.Fatalf("warning %q (line %d), want one at tenants.team.api_key_hashes[0], line %d, naming the placeholder", w, w.Line, line)
			}
		})
	}
	t.Run("a refused file lists the warning too but counts only what refuses it", func(t *testing.T) {
		_, ps := parse(t, tenant(placeholder)+"    burst: -1\n", RoleServe, noEnv)
		if len(ps) != 2 || ps.Refusals() != 1 {
			t.Fatalf("problems %v (%d refusals), want the negative burst and the placeholder's warning", ps, ps.Refusals())
		}
	})
}

func TestEmptyFileIsAProblem(t *testing.T) {
	_, ps := parse(t, "# nothing\n", RoleServe, noEnv)
	wantProblem(t, ps, "", "empty")
}

func TestWrongKindIsAProblem(t *testing.T) {
	cases := []struct{ name, src, path, msg string }{
		{"list for a mapping", minimal + "http: [a]\n", "http", "want a mapping"},
		{"mapping for a list", minimal + "nats: {urls: {a: b}}\n", "nats.urls", "want a list"},
		{"string for a bool", minimal + "policies: {default: {hedge: maybe}}\n", "policies.default.hedge", "want true or false"},
		{"string for a number", minimal + "policies: {default: {control_fraction: lots}}\n", "policies.default.control_fraction", "want a number"},
		{"bad byte size", minimal + "nats: {max_payload: 8 megs}\n", "nats.max_payload", "not a byte size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			wantProblem(t, ps, tc.path, tc.msg)
		})
	}
}

func TestDefaultsFillOnlyKeysTheFileLeavesOut(t *testing.T) {
	src := minimal + `policies:
  default:
    hedge: false
    control_fraction: 0
    delay: {quantile: 0.9}
  chat: ~
`
	c, ps := parse(t, src, RoleServe, noEnv)
	wantNoProblems(t, ps)
	def, chat := c.Policies["default"], c.Policies["chat"]
	if chat == nil {
		t.Fatalf("a null policy entry was dropped")
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"explicit false kept", def.Hedge, false},
		{"explicit zero kept", def.ControlFraction, 0.0},
		{"explicit quantile kept", def.Delay.Quantile, 0.9},
		{"sibling defaulted", def.Delay.Min, delay.DefaultOptions().Min},
		{"hedge defaulted", chat.Hedge, true},
		{"control fraction defaulted", chat.ControlFraction, delay.DefaultControlFraction},
		{"max attempts defaulted", chat.MaxAttempts, 2},
		{"deadline defaulted", chat.Deadline, 30 * time.Second},
		{"accept timeout defaulted", chat.AcceptTimeout, time.Second},
		{"commit point defaulted", chat.CommitPoint, schemas.FirstToken},
		{"trigger defaulted", chat.Trigger, TriggerFirstByte},
		{"duplicate ceiling defaulted", chat.DuplicateRate.Ceiling, 0.08},
		{"max payload defaulted", c.NATS.MaxPayload, 8 * ByteSize(1<<20)},
		{"body limit defaulted", c.HTTP.BodyLimit, 4 * ByteSize(1<<20)},
		{"listen defaulted", c.HTTP.Listen, "127.0.0.1:8080"},
		{"route in-flight defaulted", c.Routes[0].MaxInflight, 64},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s: got %v, want %v", ck.name, ck.got, ck.want)
		}
	}
}

func TestDefaultPolicyIsAddedWhenTheFileHasNone(t *testing.T) {
	c, ps := parse(t, minimal+"policies:\n  chat: {max_attempts: 3}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	def := c.PolicyFor("")
	if def == nil || def != c.Policies[DefaultPolicy] {
		t.Fatalf("PolicyFor(\"\") = %v, want the default policy", def)
	}
	if def.MaxAttempts != 2 || def.Delay.Quantile != 0.95 {
		t.Fatalf("added default policy lacks defaults: %+v", def)
	}
	if got := c.PolicyFor("chat").MaxAttempts; got != 3 {
		t.Fatalf("PolicyFor(chat).MaxAttempts = %d, want 3", got)
	}
	if c.PolicyFor("unknown") != def {
		t.Fatalf("PolicyFor of an unknown class is not the default policy")
	}
}

func TestDefaultsTableNamesRealFieldsOfTheRightType(t *testing.T) {
	c := &Config{
		Routes:   []*Route{{}},
		Pools:    map[string]*Pool{"p": {}},
		Policies: map[string]*Policy{"x": {}},
		Tenants:  map[string]*Tenant{"t": {}},
	}
	if err := applyDefaults(c, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if c.Policies["x"].Guardrail.ProbeInterval != delay.DefaultGuardrailOptions().CoolDown || c.Tenants["t"].SpendWindow != 24*time.Hour {
		t.Fatalf("defaults not applied to map entries: %+v", c)
	}
}

func TestAnchorsAndMergeKeysAreHonoured(t *testing.T) {
	src := minimal + `policies:
  default: &base
    max_attempts: 3
    delay: {quantile: 0.9}
  chat:
    <<: *base
    max_attempts: 4
`
	c, ps := parse(t, src, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := c.Policies["chat"]; got.MaxAttempts != 4 || got.Delay.Quantile != 0.9 {
		t.Fatalf("chat = max_attempts %d quantile %v; want 4 (explicit) and 0.9 (merged)", got.MaxAttempts, got.Delay.Quantile)
	}
}

func TestJSONSchemaContractInlineOrFromFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "answer.json"), []byte(`{"type":"object","required":["a"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, schema, msg string // msg empty: valid
	}{
		{"inline", "{type: object, required: [a]}", ""},
		{"file relative to the config", "answer.json", ""},
		{"missing file", "missing.json", "read schema"},
		{"inline schema that does not compile", "{type: objectx}", "does not compile"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := minimal + "    contract:\n      json_schema: " + tc.schema + "\n"
			c, err := Parse(filepath.Join(dir, "test.yaml"), []byte(src), RoleServe, noEnv)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				ct := c.Pools["general"].Contract
				if len(ct.JSONSchema.Document) == 0 || !ct.NeedsComplete() {
					t.Fatalf("contract %+v: want a schema that needs a complete answer", ct)
				}
				return
			}
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("want Problems, got %v", err)
			}
			p := wantProblem(t, ps, "pools.general.contract.json_schema", tc.msg)
			if strings.Contains(p.String(), "\n") {
				t.Fatalf("problem spans several lines: %q", p)
			}
		})
	}
}

func TestContractNeedsCompleteOnlyForWholeAnswerChecks(t *testing.T) {
	cases := []struct {
		name string
		c    Contract
		want bool
	}{
		{"empty", Contract{}, false},
		{"complete finish reason", Contract{RequireComplete: true}, true},
		{"required fields", Contract{RequiredFields: []string{"a"}}, true},
		{"schema", Contract{JSONSchema: JSONSchema{Document: []byte(`{}`)}}, true},
	}
	for _, tc := range cases {
		if got := tc.c.NeedsComplete(); got != tc.want {
			t.Errorf("%s: NeedsComplete = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRedisTLSOptionsNeedTLS(t *testing.T) {
	_, ps := parse(t, minimal+"redis:\n  url: redis://127.0.0.1:6379\n  tls: {insecure_skip_verify: true}\n", RoleServe, noEnv)
	wantProblem(t, ps, "redis.tls", "need tls.enabled")

	_, ps = parse(t, minimal+"redis:\n  url: rediss://127.0.0.1:6379\n  hash_key_env: HASH_KEY\n  tls: {insecure_skip_verify: true}\n",
		RoleServe, envOf(map[string]string{"HASH_KEY": "shared-hash-key-7f3a"}))
	wantNoProblems(t, ps)
}

func TestRedisURLMustNotHoldCredentials(t *testing.T) {
	_, ps := parse(t, minimal+"redis:\n  url: redis://u:hunter2@127.0.0.1:6379\n", RoleServe, noEnv)
	p := wantProblem(t, ps, "redis.url", "must not hold credentials")
	if strings.Contains(p.String(), "hunter2") {
		t.Fatalf("problem %q echoes the password", p)
	}
}

func TestRedisTimeoutAndKeyPrefixAreBounded(t *testing.T) {
	tests := []struct {
		name, redis, field, mentions string
	}{
		{"zero timeout never answers", "  timeout: 0s\n", "redis.timeout", "outside (0, 10s]"},
		{"a minute-long timeout is no degraded mode", "  timeout: 1m\n", "redis.timeout", "outside (0, 10s]"},
		{"a prefix with a brace would break hash tags", "  key_prefix: \"hr{x\"\n", "redis.key_prefix", "not a token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := parse(t, minimal+"redis:\n  url: redis://127.0.0.1:6379\n"+tt.redis, RoleServe, noEnv)
			wantProblem(t, ps, tt.field, tt.mentions)
		})
	}
	cfg, ps := parse(t, minimal+"redis:\n  url: redis://127.0.0.1:6379\n  hash_key_env: HASH_KEY\n", RoleServe, envOf(map[string]string{"HASH_KEY": "shared-hash-key-7f3a"}))
	wantNoProblems(t, ps)
	if cfg.Redis.Timeout != 100*time.Millisecond || cfg.Redis.KeyPrefix != "hr" {
		t.Errorf("defaults: timeout %v, prefix %q; want 100ms, hr", cfg.Redis.Timeout, cfg.Redis.KeyPrefix)
	}
}

func TestGateSettingsAreCheckedAndDefaultToTheLedgerFallback(t *testing.T) {
	tests := []struct {
		name, gate, field, mentions string
	}{
		{"an unknown mode", "  on_unavailable: sometimes\n", "gate.on_unavailable", "not one of local, fallback, refuse"},
		{"a bucket name NATS refuses", "  bucket: \"gate.x\"\n", "gate.bucket", "not a bucket name"},
		{"more replicas than JetStream allows", "  replicas: 7\n", "gate.replicas", "outside [1, 5]"},
		{"a ledger never waited for", "  timeout: 0s\n", "gate.timeout", "outside (0, 10s]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := parse(t, minimal+"gate:\n"+tt.gate, RoleServe, noEnv)
			wantProblem(t, ps, tt.field, tt.mentions)
		})
	}
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if g := cfg.Gate; g.OnUnavailable != "fallback" || g.Bucket != "hedgerow_gate" || g.Replicas != 1 || g.Timeout != time.Second {
		t.Errorf("gate defaults = %+v; want fallback, hedgerow_gate, 1 replica, 1s", g)
	}
}

func TestRecordsSettingsAreCheckedAndDefaultToAWeekOfRecords(t *testing.T) {
	tests := []struct {
		name, records, field, mentions string
	}{
		{"a stream name NATS refuses", "  stream: \"records.x\"\n", "records.stream", "not a stream name"},
		{"records kept for no time", "  max_age: 0s\n", "records.max_age", "must be positive"},
		{"a stream of no bytes", "  max_bytes: 0\n", "records.max_bytes", "must be positive"},
		{"more replicas than JetStream allows", "  replicas: 6\n", "records.replicas", "outside [1, 5]"},
		{"a deduplication window longer than the records last", "  max_age: 1m\n  duplicates: 2m\n", "records.duplicates", "outside (0, records.max_age]"},
		{"no room for a pending record", "  max_pending: 0\n", "records.max_pending", "outside [1, 1048576]"},
		{"an answer held for minutes", "  commit_timeout: 1m\n", "records.commit_timeout", "outside (0, 10s]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := parse(t, minimal+"records:\n"+tt.records, RoleServe, noEnv)
			wantProblem(t, ps, tt.field, tt.mentions)
		})
	}
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	want := Records{Stream: "hedgerow_records", MaxAge: 168 * time.Hour, MaxBytes: 1 << 30, Replicas: 1,
		Duplicates: 2 * time.Minute, MaxPending: 4096, CommitTimeout: time.Second}
	if cfg.Records != want {
		t.Errorf("records defaults = %+v; want %+v", cfg.Records, want)
	}
}

func TestTracingSettingsAreCheckedAndExportNothingByDefault(t *testing.T) {
	tests := []struct {
		name, tracing, field, mentions string
	}{
		{"an endpoint that is no URL", "  endpoint: collector:4318\n", "tracing.endpoint", "http or https URL"},
		{"credentials in the endpoint", "  endpoint: http://user:pw@collector:4318/v1/traces\n", "tracing.endpoint", "no credentials"},
		{"a ratio above one", "  endpoint: http://collector:4318/v1/traces\n  sample_ratio: 1.5\n", "tracing.sample_ratio", "outside [0, 1]"},
		{"headers for no collector", "  headers_env: OTLP_HEADERS\n", "tracing.headers_env", "without tracing.endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := parse(t, minimal+"tracing:\n"+tt.tracing, RoleServe, noEnv)
			wantProblem(t, ps, tt.field, tt.mentions)
		})
	}
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if want := (Tracing{SampleRatio: 1}); cfg.Tracing != want {
		t.Errorf("tracing defaults = %+v; want %+v (no endpoint: no traces)", cfg.Tracing, want)
	}
	cfg, ps = parse(t, minimal+"tracing: {endpoint: \"https://collector:4318/v1/traces\", sample_ratio: 0}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if cfg.Tracing.SampleRatio != 0 {
		t.Errorf("sample_ratio 0 read as %v", cfg.Tracing.SampleRatio)
	}
}

func TestGlobalCeilingsNeedRegionsThatHoldAndAreOffByDefault(t *testing.T) {
	tests := []struct {
		name, yaml, field, mentions string
	}{
		{"regions without this process's region", "global: {regions: [east, west]}\n", "deployment.region", "name this process's region"},
		{"a region not among the regions", "deployment: {region: north}\nglobal: {regions: [east, west]}\n", "deployment.region", "not one of global.regions"},
		{"a region named twice", "deployment: {region: east}\nglobal: {regions: [east, east]}\n", "global.regions[1]", "named twice"},
		{"a region that is no token", "deployment: {region: East}\n", "deployment.region", "not a token"},
		{"settings without regions", "global: {fallback_share: 0.2}\n", "global.regions", "name every region"},
		{"an unknown ceiling", "deployment: {region: east}\nglobal: {regions: [east, west], ceilings: [tenant_mood]}\n",
			"global.ceilings[0]", "not one of"},
		{"a rerun bound within two heartbeats and the clock skew", "deployment: {region: east}\nglobal: {regions: [east, west], rerun_after: 2s}\n",
			"global.rerun_after", "max_clock_skew"},
		{"an index bound under a mebibyte", "deployment: {region: east}\nglobal: {regions: [east, west], index_max_bytes: 1000}\n",
			"global.index_max_bytes", "under"},
		{"a fallback share past an even split", "deployment: {region: east}\nglobal: {regions: [east, west], fallback_share: 0.6}\n",
			"global", "fallback share"},
		{"a validity within twice the skew", "deployment: {region: east}\nglobal: {regions: [east, west], lease_validity: 2s, max_clock_skew: 1s}\n",
			"global", "twice the skew"},
		{"an interval two of which do not fit in a validity", "deployment: {region: east}\nglobal: {regions: [east, west], rebalance_interval: 5s}\n",
			"global.rebalance_interval", "two intervals must fit"},
		{"the bucket placed in no region", "deployment: {region: east}\nglobal: {regions: [east, west], authority: {placement: north}}\n",
			"global.authority.placement", "not one of global.regions"},
		{"answers replicated without regions", "global: {replicate_answers: true}\n", "global.regions", "name every region"},
		{"a rerun bound under two heartbeats", "deployment: {region: east}\nglobal: {regions: [east, west], rerun_after: 1s}\n",
			"global.rerun_after", "under 2s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := parse(t, minimal+tt.yaml, RoleServe, noEnv)
			wantProblem(t, ps, tt.field, tt.mentions)
		})
	}
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if cfg.GlobalCeiling("tenant_rate") {
		t.Error("a file without global.regions holds a ceiling across regions")
	}
	cfg, ps = parse(t, minimal+"deployment: {region: east}\nglobal: {regions: [east, west], ceilings: [route_requests]}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if !cfg.GlobalCeiling("route_requests") || cfg.GlobalCeiling("tenant_rate") {
		t.Error("global.ceilings [route_requests]: want that kind global and no other")
	}
	cfg, ps = parse(t, minimal+"deployment: {region: east}\nglobal: {regions: [east, west]}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if !cfg.GlobalCeiling("tenant_spend") || !cfg.GlobalCeiling("tenant_rate") {
		t.Error("global without ceilings: want every kind a lease splits global, a spend window's included")
	}
	if o := cfg.LeaseOptions(); o.Validity != 10*time.Second || o.Skew != time.Second || cfg.Global.RebalanceInterval != 2*time.Second {
		t.Errorf("lease defaults = %+v, interval %v; want a 10s validity, 1s skew, 2s interval", o, cfg.Global.RebalanceInterval)
	}
	if g := cfg.Global; g.ReplicateAnswers || g.RerunAfter != 30*time.Second {
		t.Errorf("user actions across regions: replicate_answers %v, rerun_after %v; want answers kept at home and 30s", g.ReplicateAnswers, g.RerunAfter)
	}
}

func TestSchemaCacheSettingsAreCheckedAndDefaultToTheArbitersBounds(t *testing.T) {
	tests := []struct {
		name, section, field, mentions string
	}{
		{"a cache under 1MiB", "  max_bytes: 512KiB\n", "schema_cache.max_bytes", "below 1MiB"},
		{"fewer entries than a tenant's share needs", "  max_entries: 3\n", "schema_cache.max_entries", "below 4"},
		{"a compile timeout of zero", "  compile_timeout: 0s\n", "schema_cache.compile_timeout", "outside (0, 10s]"},
		{"a compile timeout over 10s", "  compile_timeout: 11s\n", "schema_cache.compile_timeout", "outside (0, 10s]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := parse(t, minimal+"schema_cache:\n"+tt.section, RoleServe, noEnv)
			wantProblem(t, ps, tt.field, tt.mentions)
		})
	}
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	want := SchemaCache{MaxBytes: arbiter.DefaultSchemaCacheBytes, MaxEntries: arbiter.DefaultSchemaCacheEntries,
		CompileTimeout: arbiter.DefaultSchemaCompileTimeout}
	if cfg.SchemaCache != want {
		t.Errorf("schema_cache defaults = %+v; want the arbiter's %+v", cfg.SchemaCache, want)
	}
	cfg, ps = parse(t, minimal+"schema_cache: {max_bytes: 16MiB, max_entries: 64, compile_timeout: 200ms}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if want := (SchemaCache{MaxBytes: 16 << 20, MaxEntries: 64, CompileTimeout: 200 * time.Millisecond}); cfg.SchemaCache != want {
		t.Errorf("schema_cache = %+v; want %+v", cfg.SchemaCache, want)
	}
}

func TestByteSizeParsesPlainAndSuffixedSizes(t *testing.T) {
	cases := []struct {
		in   string
		want ByteSize
		ok   bool
	}{
		{"1048576", 1 << 20, true},
		{"512KiB", 512 << 10, true},
		{"8MiB", 8 << 20, true},
		{"1GiB", 1 << 30, true},
		{"10B", 10, true},
		{"8MB", 0, false},
		{"-1", 0, false},
		{"MiB", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseByteSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseByteSize(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if s := (8 * ByteSize(1<<20)).String(); s != "8MiB" {
		t.Errorf("String() = %q, want 8MiB", s)
	}
}

func TestParseRoleRefusesUnknownRoles(t *testing.T) {
	for _, r := range []string{"serve", "gateway", "worker"} {
		if _, err := ParseRole(r); err != nil {
			t.Errorf("ParseRole(%q): %v", r, err)
		}
	}
	if _, err := ParseRole("router"); err == nil {
		t.Errorf("ParseRole(router) succeeded")
	}
	if _, err := Parse("x.yaml", []byte(minimal), Role("router"), noEnv); err == nil {
		t.Errorf("Parse accepted an unknown role")
	}
}

func TestLoadOfAMissingFileIsAPlainError(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"), RoleServe, noEnv)
	var ps Problems
	if err == nil || errors.As(err, &ps) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load of a missing file = %v; want a wrapped os.ErrNotExist", err)
	}
}

// TestExampleConfigsLoadForEveryRole loads every file in deploy/examples for
// every role, with every environment variable it names set.
func TestExampleConfigsLoadForEveryRole(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no example configs found")
	}
	allSet := func(string) (string, bool) { return "set-by-test", true }
	for _, f := range files {
		for _, role := range []Role{RoleServe, RoleGateway, RoleWorker} {
			t.Run(filepath.Base(f)+"/"+string(role), func(t *testing.T) {
				if _, err := Load(f, role, allSet); err != nil {
					t.Fatalf("%v", err)
				}
			})
		}
	}
}

func TestDefaultPolicyConvertsToValidEngineEstimatorGuardrailAndBuckets(t *testing.T) {
	p := Defaults()
	if err := p.Engine().Validate(); err != nil {
		t.Errorf("engine policy: %v", err)
	}
	if _, err := delay.NewEstimator(p.DelayOptions()); err != nil {
		t.Errorf("delay config: %v", err)
	}
	if _, err := delay.NewGuardrail(p.GuardrailOptions()); err != nil {
		t.Errorf("guardrail config: %v", err)
	}
	dup := p.DuplicateCeiling()
	if dup.Ceiling != p.DuplicateRate.Ceiling || dup.Window != p.DuplicateRate.Window {
		t.Errorf("duplicate ceiling %+v does not follow duplicate_rate %+v", dup, p.DuplicateRate)
	}
	admit := budgets.AdmitRequest{
		UserAction: "ua", Pool: "pool", Window: "cohort",
		Attempts:   budgets.AttemptPolicy{Max: p.MaxAttempts, TTL: 2 * p.Deadline},
		Spend:      budgets.SpendPolicy{ReservationTTL: 2 * p.Deadline},
		Duplicates: dup,
	}
	if err := admit.Validate(); err != nil {
		t.Errorf("the default duplicate ceiling is refused by the budget stores: %v", err)
	}
	if got, want := p.Engine().Deadline, p.Deadline; got != want {
		t.Errorf("engine deadline %v, want the policy's %v", got, want)
	}
}

func TestDefaultsTableGivesThePolicyPackagesDefaults(t *testing.T) {
	if got, want := Defaults(), policy.Default(); !reflect.DeepEqual(got, want) {
		t.Fatalf("a policy that sets nothing is\n%+v\nwant dispatcher/policy's defaults\n%+v", got, want)
	}
}

func TestPoolModelsAreAnyProviderNameUniqueAcrossPools(t *testing.T) {
	two := minimal + `    models: [gpt-4o, gpt-4o-2024-08-06, claude-3.5-sonnet, meta-llama/Llama-3-70b]
  other:
    routes: [a]
`
	cfg, ps := parse(t, two, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Pools["general"].Models; len(got) != 4 || got[2] != "claude-3.5-sonnet" {
		t.Fatalf("models = %q", got)
	}
	cases := []struct {
		name, models, path, msg string
		line                    int
	}{
		{"empty name", `[""]`, "pools.general.models[0]", "empty", 13},
		{"control character", `["gpt\u0007"]`, "pools.general.models[0]", "control character", 13},
		{"too long", `["` + strings.Repeat("m", 257) + `"]`, "pools.general.models[0]", "more than 256", 13},
		{"leading white space", `[" gpt-4o"]`, "pools.general.models[0]", "white space", 13},
		{"another pool's name", `[gpt-4o, other]`, "pools.general.models[1]", `"other" is already a model of pools.other`, 13},
		{"the pool's own name", `[general]`, "pools.general.models[0]", "the pool's own name", 13},
		{"listed twice", `[gpt-4o, gpt-4o]`, "pools.general.models[1]", "already a model of pools.general.models[0]", 13},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := minimal + "    models: " + tc.models + "\n  other:\n    routes: [a]\n"
			_, ps := parse(t, src, RoleServe, noEnv)
			p := wantProblem(t, ps, tc.path, tc.msg)
			if p.Line != tc.line {
				t.Fatalf("problem %v at line %d, want %d", p, p.Line, tc.line)
			}
		})
	}
	// A model of one pool may not be a model of another either.
	src := minimal + "    models: [gpt-4o]\n  other:\n    routes: [a]\n    models: [gpt-4o]\n"
	_, ps = parse(t, src, RoleServe, noEnv)
	wantProblem(t, ps, "pools.other.models[0]", `"gpt-4o" is already a model of pools.general.models[0]`)
}

func TestContractPredicateKeysDecodeAndAreChecked(t *testing.T) {
	src := minimal + `    contract:
      allow_empty: true
      allow_truncated: true
      allow_content_filter: true
      max_output_tokens: 4096
`
	cfg, ps := parse(t, src, RoleServe, noEnv)
	wantNoProblems(t, ps)
	c := cfg.Pools["general"].Contract
	if !c.AllowEmpty || !c.AllowTruncated || !c.AllowContentFilter || c.MaxOutputTokens != 4096 {
		t.Fatalf("contract = %+v", c)
	}
	for _, tc := range []struct{ name, src, path, msg string }{
		{"negative limit", minimal + "    contract: {max_output_tokens: -1}\n", "pools.general.contract.max_output_tokens", "negative"},
		{"misspelt allow key", minimal + "    contract: {allow_truncation: true}\n", "pools.general.contract.allow_truncation", "unknown key"},
		{"wrong kind", minimal + "    contract: {allow_empty: maybe}\n", "pools.general.contract.allow_empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			if p := wantProblem(t, ps, tc.path, tc.msg); p.Line != 13 {
				t.Fatalf("problem %v at line %d, want 13", p, p.Line)
			}
		})
	}
}

func TestOutlierDetectionDefaultsAndBounds(t *testing.T) {
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	got := cfg.Pools["general"].OutlierDetection
	want := OutlierDetection{ConsecutiveFailures: 3, FailureRate: 0.5, MinRequests: 10, Window: 10 * time.Second,
		BaseEjection: 10 * time.Second, MaxEjection: 5 * time.Minute, MaxEjectedPercent: 50}
	if got != want {
		t.Fatalf("default outlier_detection %+v, want %+v", got, want)
	}
	cases := []struct {
		yaml, path, msg string
	}{
		{"consecutive_failures: -1", "consecutive_failures", "negative"},
		{"failure_rate: 1.5", "failure_rate", "outside [0,1]"},
		{"min_requests: 0", "min_requests", "at least 1"},
		{"window: 0s", "window", "must be positive"},
		{"base_ejection: 0s", "base_ejection", "must be positive"},
		{"max_ejection: 1s", "max_ejection", "shorter than base_ejection"},
		{"max_ejected_percent: 101", "max_ejected_percent", "outside [0,100]"},
	}
	for _, tc := range cases {
		t.Run(tc.yaml, func(t *testing.T) {
			_, ps := parse(t, minimal+"    outlier_detection: {"+tc.yaml+"}\n", RoleServe, noEnv)
			wantProblem(t, ps, "pools.general.outlier_detection."+tc.path, tc.msg)
		})
	}
	// Both triggers off turn ejection off, which is valid.
	cfg, ps = parse(t, minimal+"    outlier_detection: {consecutive_failures: 0, failure_rate: 0, min_requests: 0}\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if cfg.Pools["general"].OutlierDetection.Health().Enabled() {
		t.Fatal("outlier detection with both triggers off is enabled")
	}
}

func TestPushbackScopeDefaultsToCohortAndIsCohortOrRoute(t *testing.T) {
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Policies["default"].PushbackScope; got != PushbackCohort {
		t.Fatalf("default pushback_scope %q, want cohort", got)
	}
	cfg, ps = parse(t, minimal+"policies:\n  default:\n    pushback_scope: route\n", RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Policies["default"].PushbackScope; got != PushbackRoute {
		t.Fatalf("pushback_scope %q, want route", got)
	}
	_, ps = parse(t, minimal+"policies:\n  default:\n    pushback_scope: pool\n", RoleServe, noEnv)
	wantProblem(t, ps, "policies.default.pushback_scope", "want cohort or route")
}

// A configuration problem never prints a credential: passwords in URLs are
// masked, and a key pasted where a variable name belongs is not echoed
// (docs/architecture.md §9).
func TestProblemsNeverPrintACredential(t *testing.T) {
	const secret = "s3cretpw"
	for _, tc := range []struct {
		name, yaml, path string
		role             Role
	}{
		{"a nats url that does not parse", "nats:\n  urls: [\"nats://alice:" + secret + "@host:bad\"]\n", "nats.urls[0]", RoleGateway},
		{"a nats url of another scheme", "nats:\n  urls: [\"http://alice:" + secret + "@host:4222\"]\n", "nats.urls[0]", RoleGateway},
		{"a redis url that does not parse", "redis:\n  url: \"redis://:" + secret + "@host:bad\"\n", "redis.url", RoleServe},
		{"a redis url of another scheme", "redis:\n  url: \"http://:" + secret + "@host:6379\"\n", "redis.url", RoleServe},
		{"a base url of another scheme", strings.Replace(minimal, "http://127.0.0.1:9101", "ftp://bob:"+secret+"@127.0.0.1:9101", 1), "routes[0].base_url", RoleServe},
		{"a key where its variable's name belongs", strings.Replace(minimal, "    model: m\n", "    model: m\n    api_key_env: sk-"+secret+"\n", 1), "routes[0].api_key_env", RoleServe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.yaml
			if !strings.Contains(src, "routes:") {
				src = minimal + src
			}
			_, ps := parse(t, src, tc.role, noEnv)
			wantProblem(t, ps, tc.path, "")
			if text := ps.Error(); strings.Contains(text, secret) {
				t.Errorf("problems print the secret:\n%s", text)
			}
		})
	}
}

// A region's records stream and gate bucket default to names of its own,
// so the regions of a supercluster, sharing one JetStream, keep apart; a
// name the file gives is kept, and without a region the names are today's
// (docs/architecture.md §14). The leases' bucket is every region's.
func TestARegionsStreamAndGateBucketCarryTheRegionUnlessNamed(t *testing.T) {
	tests := []struct {
		name, extra          string
		stream, gate, leases string
	}{
		{"no region", "", "hedgerow_records", "hedgerow_gate", "hedgerow_leases"},
		{"region east", "deployment:\n  region: east\n", "hedgerow_records_east", "hedgerow_gate_east", "hedgerow_leases"},
		{"region east, names given", "deployment:\n  region: east\nrecords:\n  stream: recs\ngate:\n  bucket: led\n",
			"recs", "led", "hedgerow_leases"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, ps := parse(t, minimal+tt.extra, RoleServe, noEnv)
			wantNoProblems(t, ps)
			if got := [3]string{cfg.Records.Stream, cfg.Gate.Bucket, cfg.Global.Authority.Bucket}; got != [3]string{tt.stream, tt.gate, tt.leases} {
				t.Errorf("stream, gate bucket, leases' bucket = %v; want %s, %s, %s", got, tt.stream, tt.gate, tt.leases)
			}
		})
	}
}

// TestPprofIsOffByDefaultAndNeedsTheInternalListener: http.pprof is
// opt-in, and a file that turns it on without http.internal_listen is
// refused at http.pprof, since the profiler is never served on the API
// listener.
func TestPprofIsOffByDefaultAndNeedsTheInternalListener(t *testing.T) {
	tests := []struct {
		name    string
		http    string
		pprof   bool
		problem string // empty: accepted
	}{
		{name: "off by default", http: ""},
		{name: "off with an internal listener", http: "http: {internal_listen: 127.0.0.1:9090}\n"},
		{name: "on with an internal listener", http: "http: {internal_listen: 127.0.0.1:9090, pprof: true}\n", pprof: true},
		{name: "on without an internal listener", http: "http: {pprof: true}\n", problem: "needs http.internal_listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ps := parse(t, minimal+tt.http, RoleServe, noEnv)
			if tt.problem != "" {
				p := wantProblem(t, ps, "http.pprof", tt.problem)
				if !strings.Contains(p.Message, "never on the API listener") {
					t.Errorf("problem %q does not say why", p.Message)
				}
				return
			}
			wantNoProblems(t, ps)
			if c.HTTP.Pprof != tt.pprof {
				t.Fatalf("http.pprof = %v, want %v", c.HTTP.Pprof, tt.pprof)
			}
		})
	}
}
