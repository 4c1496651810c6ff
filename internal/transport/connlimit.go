package transport

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// DefaultMaxConnections bounds the gRPC port's open connections where
// options leave it zero. An Envoy opens one per worker thread, so 1,024
// serves a fleet of a hundred Envoys or more per instance; what each
// connection may make the server hold is bounded (docs/reliability.md,
// "Memory per connection", with what 1,000 peers that never read cost).
const DefaultMaxConnections = 1024

// LimitListener returns a listener whose Accept hands out at most max
// connections open at once. A connection past the bound is accepted and
// closed at once, never handed out, and counted in m: a client sees its
// connection closed (Envoy retries on another) rather than waiting in the
// kernel's backlog, which would hold the memory the bound is for. A
// connection handed out frees its place when it is closed.
func LimitListener(ln net.Listener, max int, m Observer) net.Listener {
	if max <= 0 {
		max = DefaultMaxConnections
	}
	return &limitListener{Listener: ln, max: int64(max), metrics: observer(m)}
}

type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	metrics Observer
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			l.metrics.GRPCConnections(1)
			return &limitedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.metrics.TransportRefused(RefusedConnection)
		_ = c.Close() // refused: nothing was read or written on it
	}
}

// limitedConn frees its listener's place once, at its first Close.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.metrics.GRPCConnections(-1)
	})
	return err
}

// CloseWrite half-closes the connection where the one under it can (TCP),
// as servers do to say goodbye to a client that is not speaking HTTP/2.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
