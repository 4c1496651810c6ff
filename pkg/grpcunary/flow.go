package grpcunary

import (
	"math"
	"sync"
	"sync/atomic"
)

// Flow control of what clients send. A stream's window is given back as the
// reader takes its bytes, since the connection window bounds them anyway;
// the connection's is given back only as the bytes leave the server's
// buffers (a call decodes its message, a streaming handler takes one, a
// stream ends), so the message bytes a connection holds never pass its
// window, however many streams send slowly.

// recvWindow is what a peer may still send, and what the server has taken
// back but not yet announced. An update goes once half the window is back.
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

// connFlow is the connection's recvWindow: taken by the reader, given back
// by whichever goroutine frees the bytes.
type connFlow struct {
	mu sync.Mutex
	w  recvWindow
}

func (f *connFlow) take(n int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.w.take(n)
}

func (f *connFlow) give(n int64) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.w.give(n)
}

// released marks a stream's held bytes as given back: what comes after
// goes back at once.
const released = math.MinInt64 / 2

// heldBytes are the connection-window bytes one stream holds.
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

// hold counts n message bytes st keeps, in its connection's and the
// server's totals of what streams hold; false, with nothing counted, when
// their bounds refuse them (canHold).
func (c *conn) hold(st *stream, n int64) bool {
	if !c.canHold(n) {
		return false
	}
	c.streamBytes.Add(n)
	c.srv.streamBytes.Add(n)
	c.unhold(st.held.hold(n))
	return true
}

// unhold gives back n held message bytes: to the totals and the window.
func (c *conn) unhold(n int64) {
	if n <= 0 {
		return
	}
	c.streamBytes.Add(-n)
	c.srv.streamBytes.Add(-n)
	c.giveBack(n)
}

// giveBack returns n bytes to the connection window, announcing them when
// worth it. Any goroutine may call it; the update does not wait behind
// pending answers (a WINDOW_UPDATE is small, and goes once per half a
// window at most).
func (c *conn) giveBack(n int64) {
	if n <= 0 {
		return
	}
	if inc := c.flow.give(n); inc > 0 {
		c.writeControl(func() error { return c.fr.WriteWindowUpdate(0, inc) })
	}
}
