package records

// SetBeforeBatch makes p call f before it publishes each batch; f may block
// to hold the batch, and with it the next, back.
func SetBeforeBatch(p *Publisher, f func(seq uint64, records int)) { p.beforeBatch = f }

// Unsettled is how many records p queued that were neither acknowledged
// nor counted failed yet.
func Unsettled(p *Publisher) uint64 {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	return p.queued - p.settled
}
