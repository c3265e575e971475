package model

import "distflash/kernels"

// The per-token losses of a call, and where they go: downloaded at the end of the call (its
// loss sum returned), or, with DeferLoss, kept on the device until TakeLoss, so that a training
// step queues its forward and backward without waiting for the device in between.

// lossQueue holds the losses of the deferred calls since the last TakeLoss: one device buffer
// with each call's B·T losses after the previous call's, grown (by a device copy) when a call
// does not fit, and each call's targets, which say which losses count.
type lossQueue struct {
	buf     kernels.Buf
	used    int
	targets [][]int32 // per pending call, in call order
}

// beginLoss points lossBuf, where this call's cross-entropy writes its per-token losses, at
// the model's loss buffer, or with DeferLoss at the next slot of the deferred ones.
func (m *Model) beginLoss(targets []int32) {
	if !m.DeferLoss {
		m.lossBuf = m.loss
		return
	}
	q, n := &m.deferred, len(targets)
	if q.buf == nil || q.buf.Len() < q.used+n {
		grown := m.be.Alloc(max(2*q.used, q.used+n, 1024))
		if q.used > 0 {
			m.be.Copy(m.be.Slice(grown, 0, q.used), m.be.Slice(q.buf, 0, q.used))
		}
		q.buf = grown
	}
	m.lossBuf = m.be.Slice(q.buf, q.used, n)
	q.used += n
	q.targets = append(q.targets, append([]int32(nil), targets...))
	m.lastHost = false
}

// endLoss ends a call's loss: it downloads the per-token losses and returns their sum over
// the targets that are not negative, and how many there are; with DeferLoss it returns 0 and
// the count, the losses staying on the device.
func (m *Model) endLoss(targets []int32) (lossSum float64, count int) {
	for _, t := range targets {
		if t >= 0 {
			count++
		}
	}
	if m.DeferLoss {
		return 0, count
	}
	m.be.Download(m.hostLoss, m.lossBuf)
	m.lastHost = true
	return sumLoss(m.hostLoss, targets), count
}

// sumLoss is the float64 sum of losses over the targets that are not negative, in token order.
func sumLoss(losses []float32, targets []int32) (s float64) {
	for i, t := range targets {
		if t >= 0 {
			s += float64(losses[i])
		}
	}
	return s
}

// TakeLoss downloads the losses of every call since the last TakeLoss that DeferLoss kept on
// the device, in one download, and returns their sum: each call's sum over its tokens in
// token order, those sums added in call order, which is exactly what the calls would have
// returned without DeferLoss, summed. 0 when no call is pending. TokenLosses then returns the
// last of those calls' losses.
func (m *Model) TakeLoss() float64 {
	q := &m.deferred
	if len(q.targets) == 0 {
		return 0
	}
	host := make([]float32, q.used)
	m.be.Download(host, m.be.Slice(q.buf, 0, q.used))
	var total float64
	off := 0
	for i, tg := range q.targets {
		total += sumLoss(host[off:off+len(tg)], tg)
		if i == len(q.targets)-1 && len(tg) == len(m.hostLoss) {
			copy(m.hostLoss, host[off:off+len(tg)])
			m.lastHost = true
		}
		off += len(tg)
	}
	q.used, q.targets = 0, q.targets[:0]
	return total
}

// TokenLosses returns the loss of each token of the last Forward or ForwardBackward (B·T
// values in token order, 0 where the target is negative). The slice is the model's, reused by
// the next call. With DeferLoss the losses are downloaded here (outside the step) when
// TakeLoss has not brought them down yet; after TakeLoss they are those it downloaded.
func (m *Model) TokenLosses() []float32 {
	if !m.lastHost && m.lossBuf != nil {
		m.be.Download(m.hostLoss, m.lossBuf)
		m.lastHost = true
	}
	return m.hostLoss
}
