package hotkeys

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// simConnPair is a connection in memory, as net.Pipe, but buffered: a write
// never waits for the reader, so a round trip to the store wakes each side
// once (net.Pipe hands every write over, and wakes the writer again when
// the reader has it).
func simConnPair() (net.Conn, net.Conn) {
	ab, ba := newSimHalf(), newSimHalf()
	closed := &simClosed{done: make(chan struct{})}
	return &simConn{in: ba, out: ab, closed: closed}, &simConn{in: ab, out: ba, closed: closed}
}

// simHalf is one direction's bytes, written but not yet read.
type simHalf struct {
	mu    sync.Mutex
	buf   []byte
	ready chan struct{} // a token while buf may hold bytes
}

func newSimHalf() *simHalf { return &simHalf{ready: make(chan struct{}, 1)} }

// simClosed is shared by both ends: closing either closes the pair.
type simClosed struct {
	once sync.Once
	done chan struct{}
}

type simConn struct {
	in, out *simHalf
	closed  *simClosed

	mu           sync.Mutex
	readDeadline time.Time
}

func (c *simConn) Read(p []byte) (int, error) {
	for {
		c.in.mu.Lock()
		if len(c.in.buf) > 0 {
			n := copy(p, c.in.buf)
			c.in.buf = c.in.buf[n:]
			if len(c.in.buf) == 0 {
				c.in.buf = c.in.buf[:0:0]
			} else {
				c.signal(c.in)
			}
			c.in.mu.Unlock()
			return n, nil
		}
		c.in.mu.Unlock()
		select {
		case <-c.closed.done:
			return 0, io.EOF
		default:
		}
		c.mu.Lock()
		deadline := c.readDeadline
		c.mu.Unlock()
		if deadline.IsZero() {
			select {
			case <-c.in.ready:
			case <-c.closed.done:
			}
			continue
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		timer := time.NewTimer(wait)
		select {
		case <-c.in.ready:
		case <-c.closed.done:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (c *simConn) signal(h *simHalf) {
	select {
	case h.ready <- struct{}{}:
	default:
	}
}

func (c *simConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed.done:
		return 0, io.ErrClosedPipe
	default:
	}
	c.out.mu.Lock()
	c.out.buf = append(c.out.buf, p...)
	c.out.mu.Unlock()
	c.signal(c.out)
	return len(p), nil
}

func (c *simConn) Close() error {
	c.closed.once.Do(func() { close(c.closed.done) })
	return nil
}

func (c *simConn) LocalAddr() net.Addr  { return simAddr{} }
func (c *simConn) RemoteAddr() net.Addr { return simAddr{} }

// SetDeadline and SetReadDeadline bound a Read; a write never waits, so
// its deadline has nothing to bound.
func (c *simConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

func (c *simConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return nil
}

func (c *simConn) SetWriteDeadline(time.Time) error { return nil }

type simAddr struct{}

func (simAddr) Network() string { return "memory" }
func (simAddr) String() string  { return "memory" }
