// Package hedge is hedgerow's hedge engine: a pure state machine for one hedge
// group — the attempts launched for one request of one user action.
//
// Modelled on etcd's raft, the engine has no goroutines, no clock, no network
// and no randomness of its own. A driver feeds it events stamped with the
// current time through [Group.Step] and executes the actions it returns. The
// live runtime drives it over NATS and Redis on real time; the simulator drives
// it on virtual time. One engine, two drivers: what the simulator predicts is
// what production does.
//
// # Driving a group
//
// Create a group with [New], then:
//
//  1. Step a [Start]. The engine answers [Admit]: take an attempt slot, reserve
//     spend and pick the primary route, then step [Admitted] with the outcome.
//  2. The engine answers [Launch] for the primary and [ArmTimer] for the
//     deadline, the accept timeout and (when the cohort may hedge) the hedge
//     delay. Fire each timer by stepping [TimerFired] at or after its time; a
//     timer that is no longer relevant is ignored, so drivers never cancel one.
//  3. Step what the worker reports: [Accepted], [Busy], [Heartbeat],
//     [FirstByte], [Progress], [Result], [CancelObserved].
//  4. When the engine needs a budget decision it answers [AskHedgeBudget]; step
//     [HedgeBudgetDecided]. When a result is valid at the commit point it
//     answers [Elect]; step [GateDecided] with the winner gate's answer.
//  5. The group's outcome is one [Commit] or one [Fail]. Attempts still running
//     are sent [Cancel]; their usage is still settled and recorded when they
//     report it, or estimated when the cancel grace period expires. A
//     committed stream ends with one [StreamEnded]; when it breaks and the
//     group may rescue it (Options.Rescues), a continuation is asked for and
//     launched as any extra attempt, and [Splice] says when its output takes
//     the stream over (docs/architecture.md §6, "Rescue").
//  6. [Group.Done] reports when nothing is left to do: the outcome is decided,
//     every attempt has its one terminal [AttemptEnded] record, every pending
//     question is answered, and the [GroupEnded] record has been emitted.
//
// Every answer the engine asks for (Admitted, HedgeBudgetDecided, GateDecided)
// must be stepped exactly once, even after the group ended, so that granted
// reservations are released and gate claims that did not commit are cleared.
//
// # Rules
//
// The rules of docs/architecture.md §4 — admission first, the hedge trigger and its gates,
// validity at the commit point, error scope over arrival order, one absolute
// deadline — each have a named test in this package. [Checker] asserts the
// invariants over any sequence of actions and is used by the property tests,
// the fuzz target and the simulator.
package hedge
