//go:build unix

package xds

import (
	"io"
	"syscall"

	"google.golang.org/grpc/mem"
)

// ReadOnReady lets gRPC read a counted connection as it reads a bare TCP
// one: wait until the socket is readable, and only then take a buffer
// from gRPC's pool for the read, which gRPC gives back once it has parsed
// the frames in it. grpc-go (1.85) reads that way only a connection that
// has this method (its readyreader.Reader) or is a bare *net.TCPConn;
// the countedConn wrapper hid the TCP connection, so every client got a
// read buffer of its own for its connection's life, 40 MB of idle
// buffers at 10,000 clients. A grpc-go that stops looking for the method
// only falls back to that buffer.
func (c *countedConn) ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return readBlocking(c.Conn, bufSize, pool)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return readBlocking(c.Conn, bufSize, pool)
	}
	var (
		buf     *[]byte
		n       int
		readErr error
	)
	err = raw.Read(func(fd uintptr) bool {
		buf = pool.Get(bufSize)
		n, readErr = syscall.Read(int(fd), *buf)
		if readErr != nil {
			pool.Put(buf)
			buf = nil
		}
		// Not readable yet: the poller waits, holding no buffer.
		return readErr != syscall.EAGAIN && readErr != syscall.EWOULDBLOCK
	})
	switch {
	case err != nil:
		if buf != nil {
			pool.Put(buf)
		}
		return nil, 0, err
	case readErr != nil:
		return nil, 0, readErr
	case n <= 0:
		// A read of 0 is the peer's orderly close.
		pool.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

// readBlocking reads a connection that is not a socket into a pooled
// buffer.
func readBlocking(r io.Reader, bufSize int, pool mem.BufferPool) (*[]byte, int, error) {
	buf := pool.Get(bufSize)
	n, err := r.Read(*buf)
	if n > 0 {
		return buf, n, nil // an error comes again with the next read
	}
	pool.Put(buf)
	if err == nil {
		err = io.ErrNoProgress
	}
	return nil, 0, err
}
