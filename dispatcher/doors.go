package dispatcher

import "encoding/json"

// ID names this dispatcher in group ids and in what its front doors
// register, so an operator can tell replicas apart.
func (d *Dispatcher) ID() string { return d.id }

// HasOperation says whether an operation class has a policy. A front door
// refuses an unknown class: it would silently run under the default policy,
// with another deadline and hedging rule than the caller chose.
func (d *Dispatcher) HasOperation(class string) bool { return d.classes[class] != nil }

// CheckResponseFormat refuses, before any group runs, a response_format the
// contract of the pool model names (its own name or an alias) cannot honour (a schema that does not compile is the
// caller's to fix). Errors match ErrUnknownPool, or ErrBadRequest together
// with arbiter.ErrInvalidResponseFormat or arbiter.ErrInvalidContract.
func (d *Dispatcher) CheckResponseFormat(model string, responseFormat json.RawMessage) error {
	_, err := d.contractFor(model, responseFormat)
	return err
}
