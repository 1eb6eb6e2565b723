package dispatcher

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// replyTokenBytes is the entropy of a group's reply token: 128 bits, so
// that an inbox cannot be guessed from the dispatcher's prefix, which
// every attempt carries (docs/architecture.md §8).
const replyTokenBytes = 16

// Reasons a reply is dropped, the "reason" label of
// hedgerow_replies_dropped_total (docs/architecture.md §8).
const (
	dropUnknownInbox = "unknown_inbox" // no live group has the token: a late reply of an ended group, or a guess
	dropMalformed    = "malformed"     // not a reply of this wire version, or no attempt number in the subject
	dropAttempt      = "attempt"       // the group sent no such attempt, or the reply names another than its inbox
	dropGroup        = "group"         // the reply names another group than the inbox's
	dropSecret       = "secret"        // the reply does not return the attempt's secret
	dropWorker       = "worker"        // the reply names another worker than the one that accepted the attempt
	dropStatus       = "status"        // a no-responders status for an attempt a worker had accepted
	dropOverflow     = "overflow"      // the group's event queue was full
)

// replyMux routes the replies to every group of a dispatcher from one
// wildcard subscription, prefix.<group token>.<attempt>, as nats.go's own
// request mux does: a subscription per group would cost the NATS server a
// SUB, an UNSUB and two passes over its subject cache per request. Tokens
// are random, never counted, so knowing one inbox (or the prefix) names no
// other.
type replyMux struct {
	mu      sync.Mutex
	prefix  string // a unique inbox; set once, before the first subscription
	sub     *nats.Subscription
	groups  map[string]*group // by token
	dropped func(reason string)
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
	token, err := newReplyToken()
	if err != nil {
		return "", err
	}
	if _, taken := m.groups[token]; taken { // 2^-128: a broken random source
		return "", fmt.Errorf("dispatcher: reply token repeated")
	}
	m.groups[token] = g
	g.replyToken = token
	return m.prefix + "." + token, nil
}

// newReplyToken returns a fresh random reply token, a NATS subject token.
func newReplyToken() (string, error) {
	var b [replyTokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("dispatcher: reply token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
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
	m.mu.Lock()
	g := m.groups[token]
	m.mu.Unlock()
	if g == nil {
		m.drop(dropUnknownInbox)
		return
	}
	n, err := strconv.Atoi(attempt)
	if err != nil {
		m.drop(dropMalformed)
		return
	}
	if !g.events.postMsg(inboundEvent{attempt: n, msg: msg, arrived: g.d.now()}, len(msg.Data)) {
		m.drop(dropOverflow)
		g.d.log.Warn("reply dropped: the group's queue is full", "group", g.id, "attempt", n)
	}
}

// drop counts a reply the mux did not hand to a group.
func (m *replyMux) drop(reason string) {
	if m.dropped != nil {
		m.dropped(reason)
	}
}
