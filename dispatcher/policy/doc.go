// Package policy holds operation-class policies and the rules both drivers
// of the hedge engine — the live dispatcher and the simulator — apply to
// them: whether a group may hedge, which primary latencies teach the hedge
// delay, and what a class's answers are expected to cost. A rule lives here
// once so that what the simulator measures is what the dispatcher runs.
//
// Policy is a class's policy as configured; Class is a class at run time,
// with what its groups teach it. Tenant is a caller's own spend limit.
package policy
