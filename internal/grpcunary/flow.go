package grpcunary

import (
	"math"
	"sync/atomic"
)

// Flow control of what clients send, and what their streams hold. What
// the server sends waits for the client's windows in writer.go.
//
// Both windows are given back as the reader takes the bytes: a window
// given back only once a message is whole would stall a client that sends
// many large messages interleaved, 16 KiB of each in turn as grpc-go's
// does, with none of them whole. What the bytes cost is bounded instead by
// counting them (conn.canHold): a stream whose bytes would pass its
// connection's bound or the server's is refused.

// recvWindow is what a peer may still send, and what the server has taken
// but not yet announced: an update goes once half the window is back. The
// reader goroutine's only.
type recvWindow struct {
	left, back, size int64
}

// take counts n bytes received; false means the peer overran the window.
func (w *recvWindow) take(n int64) bool {
	w.left -= n
	return w.left >= 0
}

// give takes n bytes back and returns the increment to announce, 0 until
// it is worth a WINDOW_UPDATE.
func (w *recvWindow) give(n int64) uint32 {
	w.back += n
	if w.back < w.size/2 {
		return 0
	}
	inc := w.back
	w.back = 0
	w.left += inc
	return uint32(inc)
}

// released marks a stream's held bytes as given back: what comes after
// goes back at once.
const released = math.MinInt64 / 2

// heldBytes are the message bytes one stream holds, from the reader's
// take until its handler decodes them (or takes them, for a streaming
// call) or the stream ends.
type heldBytes struct{ n atomic.Int64 }

// hold counts n more bytes; it returns n when the stream has released its
// bytes already, for the caller to give back at once.
func (h *heldBytes) hold(n int64) int64 {
	if h.n.Add(n) < 0 {
		return n
	}
	return 0
}

// put gives back n of the bytes (a message taken); it returns what to give
// back: n, or 0 once all was released.
func (h *heldBytes) put(n int64) int64 {
	if h.n.Add(-n) >= 0 {
		return n
	}
	return 0
}

// release gives back all the stream holds, once.
func (h *heldBytes) release() int64 {
	return max(h.n.Swap(released), 0)
}

// hold counts n message bytes st keeps in what its connection's streams
// hold; false, with nothing counted, when the bounds refuse them
// (canHold).
func (c *conn) hold(st *stream, n int64) bool {
	if !c.canHold(n) {
		return false
	}
	c.account(n)
	c.unhold(st.held.hold(n))
	return true
}

// unhold gives back n held message bytes. Any goroutine may call it.
func (c *conn) unhold(n int64) {
	if n > 0 {
		c.account(-n)
	}
}

// giveBack returns n bytes to w, the receive window of stream id (0: the
// connection's), and announces them with a WINDOW_UPDATE once enough are
// back (reader goroutine).
func (c *conn) giveBack(id uint32, w *recvWindow, n int64) error {
	if inc := w.give(n); inc > 0 {
		return c.write(func() error { return c.fr.WriteWindowUpdate(id, inc) })
	}
	return nil
}

// canHold reports whether the connection's streams may hold n more bytes
// (a new stream's headers and state, or message bytes): within the
// connection's bound and the server's. The last quarter of the server's
// bound is kept for connections holding less than smallHolding, as a
// client's with a few calls in flight does, so that clients holding
// streams and messages on a few connections cannot keep the others from
// opening theirs.
func (c *conn) canHold(n int64) bool {
	mine, all, bound := c.streamBytes.Load()+n, c.srv.totals.bytes.Load()+n, c.srv.opts.MaxStreamBytes
	switch {
	case mine > c.srv.connHold, all > bound:
		return false
	case all > bound-bound/4:
		return mine <= smallHolding
	}
	return true
}

// charge counts the n bytes st holds until it is over; uncharge gives
// them back, once.
func (c *conn) charge(st *stream, n int64) {
	st.streamBytes.Store(n)
	c.account(n)
}

func (c *conn) uncharge(st *stream) {
	c.account(-st.streamBytes.Swap(0))
}

// account adds n to what the connection's streams hold, and to the
// server's total.
func (c *conn) account(n int64) {
	if n != 0 {
		c.streamBytes.Add(n)
		c.srv.totals.bytes.Add(n)
	}
}
