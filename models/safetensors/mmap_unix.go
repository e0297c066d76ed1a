//go:build unix

package safetensors

import (
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps size bytes of f read-only. mapped reports whether the bytes
// are a mapping (to be released with unmap) rather than a heap copy: when
// mmap fails, the file is read into memory instead.
func mapFile(f *os.File, size int) (b []byte, mapped bool, err error) {
	b, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err == nil {
		return b, true, nil
	}
	b, err = readAll(f, size)
	return b, false, err
}

// unmap releases a mapping made by mapFile.
func unmap(b []byte) error { return unix.Munmap(b) }
