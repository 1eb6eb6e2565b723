package policy

// ForEmbeddings returns the class that runs the embeddings requests of c's
// operation class: the same policy with trigger total, since an embedding
// answer arrives whole and its headers say nothing of when (the engine
// commits it at complete, like every non-streaming answer). It shares c's
// estimator and guardrail — embeddings cohorts have keys of their own
// (delay.KindEmbeddings), so their latencies never mix with chat ones, and
// sketch sharing carries both — and learns its own answer lengths and
// decode rate.
func (c *Class) ForEmbeddings() *Class {
	p := *c.Policy
	p.Trigger = TriggerTotal
	return &Class{Name: c.Name, Policy: &p, Estimator: c.Estimator, Guardrail: c.Guardrail}
}
