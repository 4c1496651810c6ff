package grpcunary

import "time"

// What one client may make the server hold, in one place. docs/reliability.md
// adds them up per connection.

// Defaults where Options leave a field zero.
const (
	// DefaultMaxRecvMsgSize is grpc-go's default bound on a request message.
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultMaxConcurrentStreams bounds the calls of one connection in
	// flight, a stream counting until its handler returns: a client that
	// opens and resets streams cannot start more work than that.
	DefaultMaxConcurrentStreams = 1024
	// DefaultMaxStreamBytes bounds what the streams not yet over hold over
	// all connections (see smallHolding).
	DefaultMaxStreamBytes = 64 << 20
	// DefaultHandshakeTimeout bounds a TLS handshake, the client's
	// connection preface and its first SETTINGS frame.
	DefaultHandshakeTimeout = 10 * time.Second
)

// Headers.
const (
	// MaxHeaderListSize bounds the decoded request headers of one call; a
	// larger list resets the stream (FRAME_SIZE_ERROR, as grpc-go). Exported
	// so that grpc-go's server can be given the same bound.
	MaxHeaderListSize = 64 << 10
	// maxHeaderBlockBytes bounds the encoded bytes of one header block,
	// HEADERS and CONTINUATIONs together: past it the connection is closed,
	// so that an endless block cannot keep a reader busy (the CONTINUATION
	// flood of 2024). An honest block within MaxHeaderListSize is smaller.
	maxHeaderBlockBytes = 2 * MaxHeaderListSize
	// smallHolding: the last quarter of the server's bound on what open
	// streams hold (Options.MaxStreamBytes) is kept for connections whose
	// streams hold less, as a client's with a few calls in flight do
	// (conn.canHold), so that streams held open on a few connections
	// cannot keep others from opening theirs.
	smallHolding = 64 << 10
	// streamCost is about what a stream holds beside its headers: its
	// state, context, timer and map entry.
	streamCost = 1 << 10
)

// Messages.
const (
	// initialWindow is HTTP/2's stream window, which the server keeps: a
	// stream may send that much before the server reads it.
	initialWindow = 64 << 10
	// connWindow is the connection window, given back as bytes are read.
	connWindow = 1 << 20
	// minConnHold is the least a connection's open streams may hold:
	// headers, streamCost each, and message bytes not yet decoded; a
	// stream past it is refused. It is at least four of the largest
	// messages (connHoldFor), which a client may send interleaved.
	minConnHold = 8 << 20
	// bodyTimeout bounds how long a unary call's message may take to come
	// whole after its headers, whatever the call's own deadline says; a
	// stream idle for bodyIdleTimeout is reset sooner. A call holds no
	// place in Admit meanwhile; these free its stream and its bytes.
	bodyTimeout     = 30 * time.Second
	bodyIdleTimeout = 10 * time.Second
)

// Writes.
const (
	// maxControlFrames bounds the PING and SETTINGS frames, each answered,
	// that a client may send within a second with no request between:
	// past it the connection is not read until the second is over.
	maxControlFrames = 100
	// bufferSize is the read buffer of a connection.
	bufferSize = 32 << 10
	// maxPending bounds the bytes waiting for the flusher: past it, writers
	// wait, the reader among them, so a client that does not read its
	// answers stops being read.
	maxPending = 64 << 10
	// writeTimeout bounds one write of the flusher: a client that leaves its
	// answers unread that long is closed, which ends the writers waiting
	// on it.
	writeTimeout = 10 * time.Second
	// maxStatusMessage bounds grpc-message, so that a status fits in one
	// HEADERS frame whatever the client's frame size.
	maxStatusMessage = 1024
)

// connHoldFor is what a connection's open streams may hold with messages
// of up to maxMsg bytes.
func connHoldFor(maxMsg int) int64 {
	return max(minConnHold, 4*(int64(maxMsg)+5))
}

// Refusal names a bound of this file that refused a client something, as
// Options.OnRefuse reports it.
type Refusal string

// The refusals.
const (
	// RefusedStreams: a stream past MaxConcurrentStreams (REFUSED_STREAM).
	RefusedStreams Refusal = "streams"
	// RefusedStreamBytes: a stream or message past what the connection's
	// streams, or all connections', may hold (REFUSED_STREAM, or
	// RESOURCE_EXHAUSTED once its message had begun).
	RefusedStreamBytes Refusal = "stream_bytes"
	// RefusedMessageSize: a message past MaxRecvMsgSize (RESOURCE_EXHAUSTED).
	RefusedMessageSize Refusal = "message_size"
	// RefusedSlowMessage: a stream whose message did not come whole within
	// bodyTimeout, or whose DATA stopped for bodyIdleTimeout (reset).
	RefusedSlowMessage Refusal = "slow_message"
	// RefusedHeaderBlock: a header block past maxHeaderBlockBytes
	// (GOAWAY ENHANCE_YOUR_CALM).
	RefusedHeaderBlock Refusal = "header_block"
	// RefusedControlFlood: past maxControlFrames PING or SETTINGS frames in
	// a second, the connection was not read until the second ended.
	RefusedControlFlood Refusal = "control_flood"
	// RefusedUnreadAnswers: a write blocked writeTimeout by a client that
	// does not read its answers; the connection was closed.
	RefusedUnreadAnswers Refusal = "unread_answers"
	// RefusedHandshake: no preface and SETTINGS (or TLS handshake) within
	// DefaultHandshakeTimeout; the connection was closed.
	RefusedHandshake Refusal = "handshake"
)

// Refusals lists every Refusal, for counters that start at zero.
var Refusals = []Refusal{RefusedStreams, RefusedStreamBytes, RefusedMessageSize, RefusedSlowMessage,
	RefusedHeaderBlock, RefusedControlFlood, RefusedUnreadAnswers, RefusedHandshake}
