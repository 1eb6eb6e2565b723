package config

// continuation checks a route's continuation style: a known one, and one
// its provider speaks — Anthropic's prefill on an anthropic route, the
// OpenAI-compatible servers' continue_final_message and prefix on an
// openai route.
func (v *validator) continuation(path string, r *Route) {
	switch want := r.Continuation.Provider(); {
	case r.Continuation == ContinuationNone:
	case want == "":
		v.addf(path, "%q: want none, prefill, continue_final_message or prefix", r.Continuation)
	case r.Provider != want && (r.Provider == ProviderOpenAI || r.Provider == ProviderAnthropic):
		v.addf(path, "%s needs a route of provider %s, and route %q is %s: prefill is Anthropic's assistant prefill; continue_final_message (vLLM, SGLang) and prefix (DeepSeek) are OpenAI-compatible servers'",
			r.Continuation, want, r.Name, r.Provider)
	}
}

// rescue checks a pool's rescue settings (pools.*.rescue): a known mode,
// max within [1, MaxRescues], and, to continue, a chat pool with at least
// one route that can continue, without which no rescue could ever start.
func (v *validator) rescue(p string, pool Pool) {
	p += ".rescue"
	switch pool.Rescue.Mode {
	case RescueOff, RescueContinue:
	default:
		v.addf(p+".mode", "%q: want off or continue", pool.Rescue.Mode)
	}
	if pool.Rescue.Max < 1 || pool.Rescue.Max > MaxRescues {
		v.addf(p+".max", "%d is outside [1, %d]", pool.Rescue.Max, MaxRescues)
	}
	if pool.Rescue.Mode != RescueContinue {
		return
	}
	if pool.IsEmbeddings() {
		v.addf(p+".mode", "an embeddings pool streams nothing to rescue; continue applies to chat pools")
		return
	}
	for _, rn := range pool.Routes {
		if r, ok := v.cfg.Route(rn); ok && r.CanContinue() {
			return
		}
	}
	v.addf(p+".mode", "continue needs a route of the pool whose continuation is not none (prefill, continue_final_message or prefix)")
}
