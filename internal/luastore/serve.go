package luastore

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/alicebob/miniredis/v2/server"
)

// ServeConn serves the commands conn carries on s's miniredis, until conn
// closes (or a client sends QUIT), in one goroutine of its own. miniredis's
// own ServeConn reads in one goroutine and runs each command in another,
// flushing after each; here the replies of the commands that arrived
// together (a pipeline) are flushed together once nothing more waits to be
// read, as Redis writes them.
func (s *Store) ServeConn(conn net.Conn) {
	go func() {
		defer conn.Close()
		r := bufio.NewReader(conn)
		peer := server.NewPeer(bufio.NewWriter(conn))
		for !peer.Closed() {
			args, err := readCommand(r)
			if err != nil {
				return
			}
			s.m.Server().Dispatch(peer, args)
			if r.Buffered() == 0 {
				peer.Flush()
			}
		}
		peer.Flush()
	}()
}

// errProtocol is a command that is not a RESP array of bulk strings, the
// form every Redis client sends.
var errProtocol = errors.New("luastore: protocol error")

// maxBulk bounds a bulk string's length, as Redis's proto-max-bulk-len.
const maxBulk = 512 << 20

// readCommand reads one command: a RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	n, err := readLength(r, '*')
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: an empty command", errProtocol)
	}
	args := make([]string, n)
	for i := range args {
		size, err := readLength(r, '$')
		if err != nil {
			return nil, err
		}
		if size < 0 || size > maxBulk {
			return nil, fmt.Errorf("%w: a bulk string of %d bytes", errProtocol, size)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		if b[size] != '\r' || b[size+1] != '\n' {
			return nil, fmt.Errorf("%w: a bulk string not ended by CRLF", errProtocol)
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// readLength reads a line "<kind><integer>\r\n".
func readLength(r *bufio.Reader, kind byte) (int, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 4 || line[0] != kind || line[len(line)-2] != '\r' {
		return 0, fmt.Errorf("%w: want %q, got %q", errProtocol, kind, line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errProtocol, err)
	}
	return n, nil
}
