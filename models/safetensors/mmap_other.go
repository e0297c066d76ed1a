//go:build !unix

package safetensors

import "os"

// mapFile reads the file into memory: there is no mmap on this platform.
func mapFile(f *os.File, size int) (b []byte, mapped bool, err error) {
	b, err = readAll(f, size)
	return b, false, err
}

// unmap is never called on this platform (nothing is mapped).
func unmap([]byte) error { return nil }
