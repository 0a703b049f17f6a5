//go:build linux && (amd64 || arm64)

package feedback

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Datagrams are read in batches with recvmmsg: one system call takes every
// line queued since the last wake-up (HAProxy sends one datagram per
// request), instead of one recvfrom per line plus one that finds the
// socket empty.

// batchLen is the datagrams one recvmmsg takes; batchSlot the room of
// each: a UDP datagram's largest payload, which can hold many lines.
const (
	batchLen  = 16
	batchSlot = 64 << 10
)

// mmsghdr is struct mmsghdr of recvmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// udpBatch reads datagrams from one socket, allocation-free once built.
type udpBatch struct {
	rc    syscall.RawConn
	msgs  [batchLen]mmsghdr
	iov   [batchLen]unix.Iovec
	names [batchLen]unix.RawSockaddrAny
	buf   []byte
	n     int
	err   error
	// recv is the RawConn.Read callback, built once (a method value made
	// per call would allocate).
	recv func(fd uintptr) bool
}

func newUDPBatch(uc *net.UDPConn) (*udpBatch, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	b := &udpBatch{rc: rc, buf: make([]byte, batchLen*batchSlot)}
	for i := range b.msgs {
		b.iov[i].Base = &b.buf[i*batchSlot]
		b.iov[i].SetLen(batchSlot)
		b.msgs[i].hdr.Iov = &b.iov[i]
		b.msgs[i].hdr.SetIovlen(1)
		b.msgs[i].hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	b.recv = b.recvmmsg
	return b, nil
}

// read waits until at least one datagram is queued and takes up to
// batchLen of them; it returns how many.
func (b *udpBatch) read() (int, error) {
	b.n, b.err = 0, nil
	if err := b.rc.Read(b.recv); err != nil {
		return 0, err
	}
	return b.n, b.err
}

// recvmmsg takes what is queued without blocking; false makes RawConn.Read
// wait for the socket to be readable.
func (b *udpBatch) recvmmsg(fd uintptr) bool {
	for i := range b.msgs {
		b.msgs[i].hdr.Namelen = uint32(unsafe.Sizeof(b.names[i]))
		b.msgs[i].hdr.Flags = 0
		b.msgs[i].len = 0
	}
	for {
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.msgs[0])), batchLen, unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false
		case e != 0:
			b.err = e
		default:
			b.n = int(r)
		}
		return true
	}
}

// datagram i of the last read: its bytes and source.
func (b *udpBatch) datagram(i int) ([]byte, netip.Addr) {
	m := &b.msgs[i]
	data := b.buf[i*batchSlot : i*batchSlot+int(min(m.len, batchSlot))]
	var src netip.Addr
	switch b.names[i].Addr.Family {
	case unix.AF_INET:
		src = netip.AddrFrom4((*unix.RawSockaddrInet4)(unsafe.Pointer(&b.names[i])).Addr)
	case unix.AF_INET6:
		src = netip.AddrFrom16((*unix.RawSockaddrInet6)(unsafe.Pointer(&b.names[i])).Addr)
	}
	return data, src
}

// serveUDP reads datagrams in batches until uc is closed.
func (l *Loop) serveUDP(ctx context.Context, uc *net.UDPConn) error {
	b, err := newUDPBatch(uc)
	if err != nil {
		return fmt.Errorf("feedback listen %s: %w", uc.LocalAddr(), err)
	}
	for {
		n, err := b.read()
		if err != nil {
			if l.readEnded(ctx, err) {
				return nil
			}
			continue
		}
		for i := range n {
			data, src := b.datagram(i)
			l.Datagram(src, data)
		}
	}
}
