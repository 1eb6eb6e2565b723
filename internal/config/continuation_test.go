package config

import (
	"strings"
	"testing"
)

// continuable is minimal with route a (openai) and route b (anthropic)
// given continuation styles.
func continuable(a, b string) string {
	src := strings.Replace(minimal, "    model: m\n  - name: b", "    model: m\n    continuation: "+a+"\n  - name: b", 1)
	return strings.Replace(src, "9102\n    model: m\n", "9102\n    model: m\n    continuation: "+b+"\n", 1)
}

func TestRouteContinuationDefaultsToNoneAndMustMatchTheProvider(t *testing.T) {
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	for _, r := range cfg.Routes {
		if r.Continuation != ContinuationNone || r.CanContinue() {
			t.Errorf("route %s: default continuation %q (can continue: %v), want none", r.Name, r.Continuation, r.CanContinue())
		}
	}
	for _, tc := range []struct {
		a, b, path, msg string
	}{
		{"continue_final_message", "prefill", "", ""},
		{"prefix", "none", "", ""},
		{"none", "none", "", ""},
		{"prefill", "none", "routes[0].continuation", `prefill needs a route of provider anthropic, and route "a" is openai`},
		{"none", "continue_final_message", "routes[1].continuation", `continue_final_message needs a route of provider openai, and route "b" is anthropic`},
		{"none", "prefix", "routes[1].continuation", "prefix needs a route of provider openai"},
		{"resume", "none", "routes[0].continuation", `"resume": want none, prefill, continue_final_message or prefix`},
	} {
		t.Run(tc.a+"+"+tc.b, func(t *testing.T) {
			cfg, ps := parse(t, continuable(tc.a, tc.b), RoleServe, noEnv)
			if tc.path != "" {
				wantProblem(t, ps, tc.path, tc.msg)
				return
			}
			wantNoProblems(t, ps)
			if got := [2]Continuation{cfg.Routes[0].Continuation, cfg.Routes[1].Continuation}; got != [2]Continuation{Continuation(tc.a), Continuation(tc.b)} {
				t.Errorf("continuations %v, want [%s %s]", got, tc.a, tc.b)
			}
		})
	}
}

func TestPoolRescueIsOffByDefaultAndContinueNeedsARouteThatCanContinue(t *testing.T) {
	cfg, ps := parse(t, minimal, RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Pools["general"].Rescue; got != (Rescue{Mode: RescueOff, Max: 1}) {
		t.Fatalf("default rescue %+v, want off with max 1", got)
	}
	withRescue := func(src, rescue string) string { return src + "    rescue: {" + rescue + "}\n" }

	cfg, ps = parse(t, withRescue(continuable("none", "prefill"), "mode: continue, max: 2"), RoleServe, noEnv)
	wantNoProblems(t, ps)
	if got := cfg.Pools["general"].Rescue; got != (Rescue{Mode: RescueContinue, Max: 2}) {
		t.Fatalf("rescue %+v, want continue with max 2", got)
	}
	for _, tc := range []struct {
		name, src, path, msg string
	}{
		{"an unknown mode", withRescue(minimal, "mode: retry"), "pools.general.rescue.mode", `"retry": want off or continue`},
		{"max 0", withRescue(minimal, "max: 0"), "pools.general.rescue.max", "0 is outside [1, 3]"},
		{"max over the bound", withRescue(minimal, "max: 4"), "pools.general.rescue.max", "4 is outside [1, 3]"},
		{"continue with no route that can continue", withRescue(minimal, "mode: continue"), "pools.general.rescue.mode",
			"continue needs a route of the pool whose continuation is not none"},
		{"continue in an embeddings pool", strings.Replace(withRescue(continuable("prefix", "none"), "mode: continue"),
			"routes: [a, b]", "routes: [a]\n    kind: embeddings", 1), "pools.general.rescue.mode", "an embeddings pool streams nothing to rescue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := parse(t, tc.src, RoleServe, noEnv)
			wantProblem(t, ps, tc.path, tc.msg)
		})
	}
}
