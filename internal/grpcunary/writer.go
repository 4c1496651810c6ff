package grpcunary

import (
	"errors"
	"math"
	"runtime"
	"time"

	"golang.org/x/net/http2"
)

// The write side of a connection. Writers (handlers, the reader for its
// control replies, timers) append frames to out under wmu; the flusher
// goroutine writes them to the socket, so that answers finishing together
// share one system call. out is bounded (maxPending): a writer waits while
// it is past the bound, so a client that does not read stops being read,
// and the flusher's write deadline then closes it.

// errClosed is the error of a write on a closed connection.
var errClosed = errors.New("grpcunary: connection closed")

// write runs fn with the write side held; the frames fn writes go out
// with the flusher's next write.
func (c *conn) write(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(c.out) > maxPending && !c.closed {
		c.wcond.Wait()
	}
	return c.writeLocked(fn)
}

// writeControl is write for the few frames that must not wait for pending
// bytes to go: GOAWAYs, so that a drain is not held up by a client that
// does not read (the flusher's write deadline closes that one), and the
// connection's WINDOW_UPDATEs, which handlers send.
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
		c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		c.netMu.Lock()
		c.wmu.Unlock()
		_, err := c.nc.Write(buf)
		c.netMu.Unlock()
		if err != nil {
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
	c.write(func() error {
		if st != nil {
			st.reset = true
			c.wcond.Broadcast()
		}
		return c.fr.WriteRSTStream(id, code)
	})
}

// drain starts a graceful close: a GOAWAY that lets streams in flight
// finish, and a PING; when its answer is back, every stream the client
// opened before the GOAWAY has arrived, and a second GOAWAY names the last.
// A client that does not answer gets the second GOAWAY after a second.
func (c *conn) drain() {
	c.wmu.Lock()
	if c.goAwaySent || c.closed {
		c.wmu.Unlock()
		return
	}
	c.goAwaySent = true
	c.wmu.Unlock()
	// Armed first: the GOAWAY may wait for a client that does not read.
	c.after(time.Second, c.goAwayFinal)
	if grace := c.srv.opts.MaxConnectionAgeGrace; grace > 0 {
		c.after(grace+time.Second, c.close)
	}
	c.writeControl(func() error {
		if err := c.fr.WriteGoAway(math.MaxInt32, http2.ErrCodeNo, nil); err != nil {
			return err
		}
		return c.fr.WritePing(false, pingData(goAwayPing))
	})
}

// after runs f in d, unless the connection closes first.
func (c *conn) after(d time.Duration, f func()) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.closed {
		c.timers = append(c.timers, time.AfterFunc(d, f))
	}
}

// goAwayFinal sends the GOAWAY naming the last stream served, and closes
// the connection if none is in flight.
func (c *conn) goAwayFinal() {
	c.smu.Lock()
	if c.draining {
		c.smu.Unlock()
		return
	}
	c.draining = true
	// The reader is the only writer of maxStreamID; a stream it reads
	// after this is past lastID and dropped, and the client retries it.
	c.lastID = c.maxStreamID.Load()
	lastID, idle := c.lastID, len(c.streams) == 0
	c.smu.Unlock()
	c.writeControl(func() error { return c.fr.WriteGoAway(lastID, http2.ErrCodeNo, nil) })
	if idle {
		c.close()
	}
}

// goAwayNow ends the connection for a protocol error.
func (c *conn) goAwayNow(code http2.ErrCode) {
	c.writeControl(func() error { return c.fr.WriteGoAway(c.maxStreamID.Load(), code, nil) })
}

// close closes the connection, after writing what is pending (with a
// short deadline: a client that does not read is not waited for); calls in
// flight see their contexts canceled.
func (c *conn) close() {
	c.wmu.Lock()
	already := c.closed
	c.closed = true
	pending, timers := c.out, c.timers
	c.out, c.spare, c.timers = nil, nil, nil
	c.wcond.Broadcast()
	c.wmu.Unlock()
	if already {
		return
	}
	for _, t := range timers {
		t.Stop()
	}
	c.cancel()
	c.smu.Lock()
	c.gone = true
	for _, st := range c.streams {
		if st.cancel != nil {
			st.cancel()
		}
		// A handler still running is told by its context, and gives its
		// place back when it returns.
		if st.expiry != nil {
			st.expiry.Stop()
		}
	}
	c.smu.Unlock()
	if len(pending) > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.netMu.Lock()
		c.nc.Write(pending)
		c.netMu.Unlock()
	}
	c.nc.Close()
}

func pingData(v uint64) (d [8]byte) {
	for i := range d {
		d[7-i] = byte(v >> (8 * i))
	}
	return d
}
