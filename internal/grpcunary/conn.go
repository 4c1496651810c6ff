package grpcunary

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// goAwayPing marks the PING that follows the first GOAWAY of a drain.
const goAwayPing = 0x676f61776179 // "goaway"

var clientPreface = []byte(http2.ClientPreface)

// conn is one client connection. Its state is grouped by who may touch it:
// connReader is the reader goroutine's (reader.go), connWriter is guarded
// by wmu (writer.go), the stream map by smu; what the streams hold is
// counted atomically (flow.go), since handlers give bytes back.
type conn struct {
	srv    *Server
	nc     net.Conn
	fr     *http2.Framer   // reads for the reader; writes into out under wmu
	ctx    context.Context // canceled when the connection ends
	cancel context.CancelFunc
	admit  AdmitFunc // this connection's, nil when the server has none

	connReader
	connWriter

	streamBytes atomic.Int64 // what the streams not over hold (see canHold)

	// Streams by id, from their headers until they end; smu guards it.
	smu     sync.Mutex
	streams map[uint32]*stream
	// draining: the final GOAWAY went (at lastID): no stream past it starts,
	// and the connection closes when the last stream ends.
	draining bool
	lastID   uint32
	gone     bool // closed: the streams' contexts are canceled
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv:     s,
		nc:      nc,
		streams: map[uint32]*stream{},
	}
	c.flow = recvWindow{left: initialWindow - 1, size: connWindow} // RFC 9113's 65,535
	c.sendWindow = initialWindow - 1
	c.peerWindow = initialWindow - 1
	c.peerFrame = 16 << 10
	c.flush = make(chan struct{}, 1)
	if s.opts.NewConnAdmit != nil {
		c.admit = s.opts.NewConnAdmit()
	}
	c.wcond = sync.NewCond(&c.wmu)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.fr = http2.NewFramer(outWriter{c}, bufio.NewReaderSize(nc, bufferSize))
	c.hdec = hpack.NewDecoder(4096, c.hp.field)
	c.hdec.SetMaxStringLength(MaxHeaderListSize)
	c.fr.SetMaxReadFrameSize(16 << 10) // HTTP/2's default, which the settings keep
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c
}

// serve checks the client's preface, sends the server's SETTINGS, starts
// the flusher and reads the connection until it ends, then closes it.
func (c *conn) serve() {
	defer c.dropStreams() // after close, once nothing more is read
	defer c.close()
	// The preface and the first SETTINGS must come within the handshake
	// bound: a connection that sends neither holds nothing for long.
	// Setting a deadline fails only on a closed connection, whose read fails.
	_ = c.nc.SetReadDeadline(time.Now().Add(DefaultHandshakeTimeout))
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(c.nc, preface); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.refuse(RefusedHandshake)
		}
		return
	}
	if !bytes.Equal(preface, clientPreface) {
		// Not HTTP/2: a FIN, then what the client still sends is read
		// briefly, so that the close is not a reset that loses the FIN. All
		// best effort on a connection being closed: errors change nothing.
		if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, io.LimitReader(c.nc, 64<<10))
		return
	}
	err := c.write(func() error {
		if err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.srv.opts.MaxConcurrentStreams},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: MaxHeaderListSize},
		); err != nil {
			return err
		}
		// The connection window starts at HTTP/2's default; it grows to
		// connWindow at once.
		inc := int64(connWindow - (initialWindow - 1))
		c.flow.left += inc
		return c.fr.WriteWindowUpdate(0, uint32(inc))
	})
	if err != nil {
		return
	}
	go c.flusher()
	if age := c.srv.opts.MaxConnectionAge; age > 0 {
		jitter := time.Duration(rand.Int64N(int64(age)/5+1)) - age/10
		c.after(age+jitter, c.drain)
	}
	c.readLoop()
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
	// The write fails only once the connection is closed: nothing to drain.
	_ = c.writeControl(func() error {
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
	// The write fails only once the connection is closed: the client sees it.
	_ = c.writeControl(func() error { return c.fr.WriteGoAway(lastID, http2.ErrCodeNo, nil) })
	if idle {
		c.close()
	}
}

// goAwayNow ends the connection for a protocol error.
func (c *conn) goAwayNow(code http2.ErrCode) {
	// The write fails only once the connection is closed: the client sees it.
	_ = c.writeControl(func() error { return c.fr.WriteGoAway(c.maxStreamID.Load(), code, nil) })
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
	// Last words on a connection being torn down: if they fail, the client
	// sees the connection end all the same, and there is no one to tell.
	if len(pending) > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.netMu.Lock()
		_, _ = c.nc.Write(pending)
		c.netMu.Unlock()
	}
	_ = c.nc.Close()
}

// dropStreams forgets what the streams left at close hold, once the
// reader has stopped: a stream whose message never came whole has no
// handler to give its bytes back.
func (c *conn) dropStreams() {
	c.smu.Lock()
	left := make([]*stream, 0, len(c.streams))
	for _, st := range c.streams {
		left = append(left, st)
	}
	c.smu.Unlock()
	for _, st := range left {
		c.uncharge(st)
		c.account(-st.held.release())
	}
}

func pingData(v uint64) (d [8]byte) {
	for i := range d {
		d[7-i] = byte(v >> (8 * i))
	}
	return d
}
