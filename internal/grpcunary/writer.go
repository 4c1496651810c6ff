package grpcunary

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The write side of a connection. Writers (handlers, the reader for its
// control replies, timers) append frames to out under wmu; the flusher
// goroutine writes them to the socket, so that answers finishing together
// share one system call. out is bounded (maxPending): a writer waits while
// it is past the bound, so a client that does not read stops being read,
// and the flusher's write deadline then closes it. DATA frames also wait
// for the client's send windows (sendData, awaitWindow): the other half of
// flow control, whose receive side is in flow.go.

// connWriter is the write side's state, guarded by wmu.
type connWriter struct {
	wmu sync.Mutex
	// wcond is signaled when a send window grows, out was written, or the
	// connection closed.
	wcond *sync.Cond
	// Frames are appended to out, which the flusher goroutine writes to
	// the connection; spare is the buffer it wrote last, kept for reuse.
	out, spare  []byte
	flushQueued bool
	flush       chan struct{} // wakes the flusher
	// netMu orders the writes to nc: the flusher takes it before it lets
	// go of wmu, so close's last write follows the frames taken before.
	netMu      sync.Mutex
	henc       *hpack.Encoder
	hbuf       bytes.Buffer
	data       []byte        // one DATA payload being built
	sendWindow int64         // the connection's send window
	peerWindow int64         // the client's initial stream window
	peerFrame  uint32        // the largest frame the client takes
	closed     bool          // writes fail from now on
	goAwaySent bool          // the first GOAWAY of a drain went
	timers     []*time.Timer // stopped by close
}

// errClosed is the error of a write on a closed connection.
var errClosed = errors.New("grpcunary: connection closed")

// write runs fn with the write side held; the frames fn writes go out
// with the flusher's next write. It fails with errClosed once the
// connection is closed; fn's frames go into out, which does not fail, so
// that is in effect its only error, and callers with nothing to undo
// ignore it: the client sees the connection end.
func (c *conn) write(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(c.out) > maxPending && !c.closed {
		c.wcond.Wait()
	}
	return c.writeLocked(fn)
}

// writeControl is write for the frames that must not wait for pending
// bytes to go: GOAWAYs, so that a drain is not held up by a client that
// does not read (the flusher's write deadline closes that one).
func (c *conn) writeControl(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(fn)
}

// writeLocked runs fn (wmu held) unless the connection is closed.
func (c *conn) writeLocked(fn func() error) error {
	if c.closed {
		return errClosed
	}
	err := fn()
	c.queueFlush()
	return err
}

// queueFlush wakes the flusher if frames wait (wmu held).
func (c *conn) queueFlush() {
	if len(c.out) > 0 && !c.flushQueued {
		c.flushQueued = true
		c.flush <- struct{}{}
	}
}

// flusher writes the frames the connection's writers leave in out. Woken,
// it first yields the processor, as grpc-go's writer does: the handlers
// runnable then add their answers, and one system call sends them all.
func (c *conn) flusher() {
	for {
		select {
		case <-c.flush:
		case <-c.ctx.Done():
			return
		}
		runtime.Gosched()
		c.wmu.Lock()
		buf := c.out
		c.out, c.spare = c.spare[:0], nil
		c.flushQueued = false
		if len(buf) == 0 {
			c.wmu.Unlock()
			continue
		}
		// Under wmu: close, which shortens the deadline, comes after.
		// Fails only on a closed connection, whose Write below fails.
		_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		c.netMu.Lock()
		c.wmu.Unlock()
		_, err := c.nc.Write(buf)
		c.netMu.Unlock()
		if err != nil {
			// A close for another reason cuts the write short the same way
			// (it shortens the deadline): only a write that ran out its own
			// time is the client's unread answers.
			c.wmu.Lock()
			closing := c.closed
			c.wmu.Unlock()
			if errors.Is(err, os.ErrDeadlineExceeded) && !closing {
				c.refuse(RefusedUnreadAnswers)
			}
			c.close()
			return
		}
		c.wmu.Lock()
		if cap(buf) <= 2*maxPending {
			c.spare = buf[:0]
		}
		c.wcond.Broadcast()
		c.wmu.Unlock()
	}
}

// outWriter is the framer's writer: frames go to out (wmu held).
type outWriter struct{ c *conn }

func (w outWriter) Write(p []byte) (int, error) {
	w.c.out = append(w.c.out, p...)
	return len(p), nil
}

// writeReset sends RST_STREAM for stream id, and marks st (if any) reset so
// that its writers stop.
func (c *conn) writeReset(st *stream, id uint32, code http2.ErrCode) {
	// The write fails only once the connection is closed: no stream to reset.
	_ = c.write(func() error {
		if st != nil {
			st.reset = true
			c.wcond.Broadcast()
		}
		return c.fr.WriteRSTStream(id, code)
	})
}

// fits reports whether size bytes of DATA go at once (wmu held).
func (c *conn) fits(st *stream, size int) bool {
	return int64(size) <= min(c.sendWindow, st.sendWindow, int64(c.peerFrame))
}

// sendData writes buf as DATA frames of st (wmu held), waiting for the
// client's windows as needed; it stops early when the stream is reset
// meanwhile. buf must not be shared if it may wait: others write then.
func (c *conn) sendData(st *stream, buf []byte, endStream bool) error {
	for sent := 0; ; {
		if sent < len(buf) && !c.closed && !st.reset && (c.sendWindow <= 0 || st.sendWindow <= 0) {
			if err := c.awaitWindow(st); err != nil {
				return err
			}
		}
		if c.closed {
			return errClosed
		}
		if st.reset {
			return nil
		}
		n := int(min(int64(len(buf)-sent), c.sendWindow, st.sendWindow, int64(c.peerFrame)))
		if err := c.fr.WriteData(st.id, endStream && sent+n == len(buf), buf[sent:sent+n]); err != nil {
			return err
		}
		c.sendWindow -= int64(n)
		st.sendWindow -= int64(n)
		if sent += n; sent == len(buf) {
			return nil
		}
	}
}

// awaitWindow waits (wmu held) until the client's windows let st send, the
// stream is reset, the connection closes, or st's context ends: a client
// that keeps its window shut past its deadline has the stream reset.
func (c *conn) awaitWindow(st *stream) error {
	var done <-chan struct{}
	if st.ctx != nil {
		done = st.ctx.Done()
		stop := context.AfterFunc(st.ctx, func() {
			c.wmu.Lock()
			c.wcond.Broadcast()
			c.wmu.Unlock()
		})
		defer stop()
	}
	for !c.closed && !st.reset && (c.sendWindow <= 0 || st.sendWindow <= 0) {
		select {
		case <-done:
			st.reset = true
			return c.fr.WriteRSTStream(st.id, http2.ErrCodeCancel)
		default:
		}
		// Let the client see what went, and wait for its window.
		c.queueFlush()
		c.wcond.Wait()
	}
	return nil
}
