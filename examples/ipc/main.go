// Ipc shares a tensor between two processes with no copy. The producer
// fills a float32 tensor in a shareable chunk on the host driver, listens
// on a Unix socket (mode 0600) in a temporary directory, and starts a
// consumer: this same program, run again with VMARENA_EXAMPLE_IPC_SOCK
// naming the socket. The producer exports the chunk to the consumer's
// process ID alone and sends it as a file descriptor; the consumer imports
// it, maps it, reads the tensor where it lies, checksums it, writes one
// element, and exits. The producer prints both checksums, sees the
// consumer's write in its own mapping, and the time from the export to
// the consumer's first read.
//
//	go run ./examples/ipc
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/ipc"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// consumerEnv names the producer's socket in the consumer's environment;
// its presence is what makes a process the consumer (realMain checks it,
// run by main, and by TestMain in the test binary).
const consumerEnv = "VMARENA_EXAMPLE_IPC_SOCK"

// The tensor: 1024 x 1024 float32, 4 MiB (two chunks of the host driver's
// default 2 MiB granularity, in one chunk).
const (
	rows, cols = 1024, 1024
	size       = rows * cols * 4
)

// marker is what the consumer writes to the last element.
const marker = -1

// timeout bounds every wait for the other process.
const timeout = 30 * time.Second

func main() { os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr)) }

// realMain runs the producer, or the consumer when the environment names
// the producer's socket (the consumer reports on stdout, for the
// producer), and returns the exit status: 2 for an argument (the example
// takes none), 1 for a failure, printed as one line on stderr.
func realMain(args []string, stdout, stderr io.Writer) int {
	if sock, ok := os.LookupEnv(consumerEnv); ok {
		if err := consume(stdout, sock); err != nil {
			fmt.Fprintf(stderr, "ipc consumer: %v\n", err)
			return 1
		}
		return 0
	}
	fs := flag.NewFlagSet("ipc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package printed the problem and the usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ipc: unexpected argument %q; the example takes none\n", fs.Arg(0))
		return 2
	}
	if err := run(stdout); err != nil {
		fmt.Fprintf(stderr, "ipc: %v\n", err)
		return 1
	}
	return 0
}

// stack is one process's host driver, reservation and mapping table.
type stack struct {
	drv *host.Driver
	mem *physical.Memory
	res *vaspace.Reservation
	tab *mapping.Table
}

func open() (s *stack, err error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: size})
	if err != nil {
		return nil, err
	}
	s = &stack{drv: drv, mem: physical.New(drv)}
	if s.res, err = vaspace.New(drv).Reserve(size, 0); err != nil {
		return nil, errors.CombineErrors(err, drv.Close())
	}
	if s.tab, err = mapping.New(s.res, s.mem); err != nil {
		return nil, errors.CombineErrors(err, drv.Close())
	}
	return s, nil
}

// close unmaps and releases whatever is left and closes the driver.
func (s *stack) close() error {
	return errors.CombineErrors(
		errors.CombineErrors(s.tab.Close(), s.res.Free()),
		errors.CombineErrors(s.mem.Close(), s.drv.Close()))
}

// mapped is [addr, addr+n) of a host-driver reservation as a tensor.Buffer:
// the driver's HostBytes, a slice over the mapped memory itself.
type mapped struct {
	hm   driver.HostMapper
	addr driver.Addr
	n    uint64
}

func (m mapped) Bytes() ([]byte, error) { return m.hm.HostBytes(m.addr, m.n) }
func (m mapped) Addr() driver.Addr      { return m.addr }

// mapTensor maps c at the reservation's base, read-write for device 0,
// and lays the rows x cols float32 tensor over it; it returns the
// tensor's elements (the mapped memory, typed) and an unmap.
func (s *stack) mapTensor(c *physical.Chunk) ([]float32, func() error, error) {
	base := s.res.Base()
	if err := s.tab.Map(base, c); err != nil {
		return nil, nil, err
	}
	unmap := func() error { return s.tab.Unmap(base) }
	if err := s.tab.SetAccess(base, size, 0, driver.AccessReadWrite); err != nil {
		return nil, nil, errors.CombineErrors(err, unmap())
	}
	t, err := tensor.New(mapped{hm: s.drv, addr: base, n: size}, tensor.Float32, rows, cols)
	if err != nil {
		return nil, nil, errors.CombineErrors(err, unmap())
	}
	data, err := tensor.Data[float32](t)
	if err != nil {
		return nil, nil, errors.CombineErrors(err, unmap())
	}
	return data, unmap, nil
}

// checksum is FNV-1a over the elements' bits, in order.
func checksum(xs []float32) uint64 {
	h := uint64(14695981039346656037)
	for _, x := range xs {
		h ^= uint64(math.Float32bits(x))
		h *= 1099511628211
	}
	return h
}

func run(w io.Writer) (err error) {
	p, err := open()
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, p.close()) }()
	c, err := p.mem.Create(0, size, driver.ChunkOptions{Shareable: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, c.Release()) }()
	data, unmap, err := p.mapTensor(c)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, unmap()) }()
	for i := range data {
		data[i] = float32(i%4099)*0.25 - 512
	}
	sum := checksum(data)
	fmt.Fprintf(w, "producer (pid %d): a float32 tensor [%d %d], %s, in a shareable chunk mapped read-write at %s\n",
		os.Getpid(), rows, cols, units.Bytes(size), p.res.Base())

	dir, err := os.MkdirTemp("", "vmarena-ipc-")
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, os.RemoveAll(dir)) }()
	l, err := ipc.Listen(filepath.Join(dir, "producer.sock"), 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()

	// The consumer is this program again (under go test, the test binary,
	// whose TestMain plays the consumer).
	exe, err := os.Executable()
	if err != nil {
		return errors.Wrap(err, "ipc: the path of this program, to run the consumer")
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), consumerEnv+"="+l.Path())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return errors.Wrap(err, "ipc: start the consumer")
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	consumerFailed := func(err error) error {
		return errors.Wrapf(err, "ipc: the consumer (pid %d): %s", cmd.Process.Pid, strings.TrimSpace(errOut.String()))
	}
	kill := func(why string) error {
		_ = cmd.Process.Kill()
		<-exited
		return errors.Newf("ipc: the consumer (pid %d) %s within %s; killed it: %s", cmd.Process.Pid, why, timeout, strings.TrimSpace(errOut.String()))
	}

	type accepted struct {
		conn *ipc.Conn
		err  error
	}
	acc := make(chan accepted, 1)
	go func() { conn, err := l.Accept(); acc <- accepted{conn, err} }()
	var conn *ipc.Conn
	select {
	case a := <-acc:
		if a.err != nil {
			return errors.CombineErrors(a.err, kill("did not connect"))
		}
		conn = a.conn
	case err := <-exited:
		return consumerFailed(errors.Wrap(errors.CombineErrors(err, errors.New("exited")), "before connecting"))
	case <-time.After(timeout):
		return kill("did not connect")
	}
	defer func() { err = errors.CombineErrors(err, conn.Close()) }()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return errors.CombineErrors(err, kill("was not sent the chunk"))
	}
	if conn.PeerPID() != cmd.Process.Pid {
		return errors.CombineErrors(
			errors.Newf("ipc: the peer on %s is pid %d, not the consumer %d", l.Path(), conn.PeerPID(), cmd.Process.Pid),
			kill("was not sent the chunk"))
	}
	fmt.Fprintf(w, "consumer (pid %d): started from %s, connected on %s (mode 0600); SO_PEERCRED says pid %d\n",
		cmd.Process.Pid, filepath.Base(exe), filepath.Base(l.Path()), conn.PeerPID())

	exportedAt := time.Now()
	if _, err := c.Export(cmd.Process.Pid); err != nil {
		return errors.CombineErrors(err, kill("was not sent the chunk"))
	}
	if err := conn.SendChunk(c); err != nil {
		return errors.CombineErrors(err, kill("was not sent the chunk"))
	}
	fmt.Fprintf(w, "producer: exported the chunk to pid %d alone and sent it as a file descriptor\n", cmd.Process.Pid)

	select {
	case err := <-exited:
		if err != nil {
			return consumerFailed(err)
		}
	case <-time.After(timeout):
		return kill("did not finish")
	}
	got, err := parse(out.String())
	if err != nil {
		return consumerFailed(err)
	}
	fmt.Fprintf(w, "consumer: imported %s, mapped it read-write at %s, read the tensor where it lies (first element %v), wrote %v to element [%d %d]\n",
		units.Bytes(got.size), got.addr, got.first, float32(marker), rows-1, cols-1)
	fmt.Fprintf(w, "producer checksum: %#016x\n", sum)
	fmt.Fprintf(w, "consumer checksum: %#016x\n", got.sum)
	fmt.Fprintf(w, "element [%d %d] in the producer's mapping, after the consumer exited: %v\n", rows-1, cols-1, data[len(data)-1])
	if got.sum != sum {
		return errors.Newf("ipc: the consumer read checksum %#x, the producer wrote %#x", got.sum, sum)
	}
	if data[len(data)-1] != marker {
		return errors.Newf("ipc: the producer does not see the consumer's write: %v", data[len(data)-1])
	}
	fmt.Fprintln(w, "no bytes copied: both processes map the same memory")
	fmt.Fprintf(w, "export to the consumer's first read: %v (export, send, import, map, grant access, first element read)\n",
		got.firstRead.Sub(exportedAt))
	return nil
}

// report is what the consumer printed.
type report struct {
	size      uint64
	addr      driver.Addr
	first     float32
	sum       uint64
	firstRead time.Time
}

// parse reads the consumer's "key value" lines.
func parse(out string) (r report, err error) {
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		var n uint64
		if n, err = strconv.ParseUint(v, 0, 64); err != nil {
			return r, errors.Wrapf(err, "ipc: the consumer's %q line", k)
		}
		switch k {
		case "size":
			r.size = n
		case "addr":
			r.addr = driver.Addr(n)
		case "first":
			r.first = math.Float32frombits(uint32(n))
		case "checksum":
			r.sum = n
		case "first-read":
			r.firstRead = time.Unix(0, int64(n))
		default:
			continue
		}
		seen[k] = true
	}
	if len(seen) != 5 {
		return r, errors.Newf("ipc: the consumer reported %d of 5 figures:\n%s", len(seen), out)
	}
	return r, nil
}

// consume is the consumer: it receives the chunk on sock, maps it, reads
// and checksums the tensor, writes the marker to its last element, and
// reports on w as "key value" lines.
func consume(w io.Writer, sock string) (err error) {
	// Ready before connecting: the producer exports once connected, and
	// the time it prints runs from then.
	s, err := open()
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, s.close()) }()
	conn, err := ipc.Dial(sock)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, conn.Close()) }()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if conn.PeerPID() != os.Getppid() {
		return errors.Newf("ipc consumer: the peer on %s is pid %d, not the parent %d", sock, conn.PeerPID(), os.Getppid())
	}
	c, err := conn.RecvChunk(s.mem, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, c.Release()) }()
	data, unmap, err := s.mapTensor(c)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, unmap()) }()
	first := data[0]
	firstRead := time.Now()
	sum := checksum(data)
	data[len(data)-1] = marker
	fmt.Fprintf(w, "size %d\naddr %#x\nfirst %#x\nchecksum %#x\nfirst-read %d\n",
		c.Size(), uint64(s.res.Base()), math.Float32bits(first), sum, firstRead.UnixNano())
	return nil
}
