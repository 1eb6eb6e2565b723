package dispatcher

import (
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// replyMux routes the replies to every group of a dispatcher from one
// wildcard subscription, prefix.<group token>.<attempt>, as nats.go's own
// request mux does: a subscription per group would cost the NATS server a
// SUB, an UNSUB and two passes over its subject cache per request.
type replyMux struct {
	mu     sync.Mutex
	prefix string // a unique inbox; set once, before the first subscription
	sub    *nats.Subscription
	groups map[string]*group // by token
	next   uint64
	// closing: the dispatcher closed; the subscription ends with the last
	// group (one may still start as Close begins).
	closing bool
}

// register gives g a reply inbox of its own, subscribing the mux first if
// it is not (or no longer) subscribed. It fails as a subscription of the
// group's own would: on a closed or draining connection.
func (m *replyMux) register(nc *nats.Conn, g *group) (string, error) {
	switch {
	case nc.IsClosed():
		return "", nats.ErrConnectionClosed
	case nc.IsDraining():
		return "", nats.ErrConnectionDraining
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sub == nil || !m.sub.IsValid() {
		if m.prefix == "" {
			m.prefix = nc.NewInbox()
		}
		sub, err := nc.Subscribe(m.prefix+".*.*", m.route)
		if err != nil {
			return "", err
		}
		m.sub = sub
		if m.groups == nil {
			m.groups = make(map[string]*group)
		}
	}
	m.next++
	token := strconv.FormatUint(m.next, 36)
	m.groups[token] = g
	g.replyToken = token
	return m.prefix + "." + token, nil
}

// unregister forgets a finished group: later replies to it are dropped.
func (m *replyMux) unregister(g *group) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.groups, g.replyToken)
	if m.closing {
		m.unsubscribeIfIdleLocked()
	}
}

// close unsubscribes the mux once no group is left; the dispatcher calls it
// when it is closed and its groups are done.
func (m *replyMux) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closing = true
	m.unsubscribeIfIdleLocked()
}

func (m *replyMux) unsubscribeIfIdleLocked() {
	if m.sub != nil && len(m.groups) == 0 {
		_ = m.sub.Unsubscribe()
		m.sub = nil
	}
}

// route runs on the mux subscription's goroutine: it only hands the message
// to its group's queue, which never blocks.
func (m *replyMux) route(msg *nats.Msg) {
	subj := msg.Subject
	if len(subj) <= len(m.prefix) || subj[:len(m.prefix)] != m.prefix || subj[len(m.prefix)] != '.' {
		return
	}
	token, attempt, _ := strings.Cut(subj[len(m.prefix)+1:], ".")
	n, err := strconv.Atoi(attempt)
	if err != nil {
		return
	}
	m.mu.Lock()
	g := m.groups[token]
	m.mu.Unlock()
	if g == nil {
		return
	}
	if !g.events.postMsg(inboundEvent{attempt: n, msg: msg}, len(msg.Data)) {
		g.d.log.Warn("reply dropped: the group's queue is full", "group", g.id, "attempt", n)
	}
}
