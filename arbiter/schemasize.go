package arbiter

import (
	"reflect"
	"slices"
	"unsafe"
)

// retainedSize measures the heap bytes a value keeps alive: every object
// reachable from it through pointers, slices, maps, strings and interfaces,
// each counted once, its size rounded up to the allocator's size class.
// The schema cache is bounded by these bytes (docs/architecture.md §6), so
// they are measured on the compiled graph itself rather than guessed from
// the schema's text: a compiled property costs about fifty times its bytes
// as sent.
//
// It is an estimate of what the garbage collector would find, not an exact
// count: a map's table is sized from its length as growth by insertion
// leaves it, a string or slice sharing another's memory from a different
// start is counted twice, an interface's boxed scalar once per reference,
// and functions count as their pointer alone (closures' captures are not
// followed). TestRetainedSizeOfSchemasTracksTheHeapTheyHold checks it
// against the heap N retained schemas hold.
func retainedSize(v any) int64 {
	s := sizer{seen: make(map[uintptr]struct{})}
	s.inline(reflect.ValueOf(&v).Elem())
	return s.total
}

// sizer walks a value graph, adding each newly seen object's bytes to
// total.
type sizer struct {
	seen  map[uintptr]struct{}
	total int64
}

// first reports whether the object at addr is met for the first time,
// marking it seen.
func (s *sizer) first(addr uintptr) bool {
	if _, ok := s.seen[addr]; ok {
		return false
	}
	s.seen[addr] = struct{}{}
	return true
}

// inline walks what a value held inside another object (a field, an
// element, a map slot) refers to; the value's own bytes are its holder's.
func (s *sizer) inline(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() || !s.first(v.Pointer()) {
			return
		}
		s.total += allocSize(v.Type().Elem().Size())
		s.inline(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			s.inline(v.Field(i))
		}
	case reflect.Array:
		if !holdsPointers(v.Type().Elem()) {
			return
		}
		for i := range v.Len() {
			s.inline(v.Index(i))
		}
	case reflect.Slice:
		if v.Cap() == 0 || !s.first(v.Pointer()) {
			return
		}
		s.total += allocSize(uintptr(v.Cap()) * v.Type().Elem().Size())
		if !holdsPointers(v.Type().Elem()) {
			return
		}
		for i := range v.Len() {
			s.inline(v.Index(i))
		}
	case reflect.String:
		str := v.String()
		if len(str) == 0 || !s.first(uintptr(unsafe.Pointer(unsafe.StringData(str)))) {
			return
		}
		s.total += allocSize(uintptr(len(str)))
	case reflect.Interface:
		if v.IsNil() {
			return
		}
		e := v.Elem()
		switch e.Kind() {
		case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.UnsafePointer:
			// Pointer-shaped: the interface holds the pointer itself.
		default:
			// Anything else is boxed: the interface points at a copy.
			s.total += allocSize(e.Type().Size())
		}
		s.inline(e)
	case reflect.Map:
		if v.IsNil() || !s.first(v.Pointer()) {
			return
		}
		s.total += mapSize(v.Len(), v.Type().Key().Size()+v.Type().Elem().Size())
		if !holdsPointers(v.Type().Key()) && !holdsPointers(v.Type().Elem()) {
			return
		}
		it := v.MapRange()
		for it.Next() {
			s.inline(it.Key())
			s.inline(it.Value())
		}
	}
	// Numbers, booleans, functions, channels and unsafe pointers refer to
	// nothing the walk counts.
}

// holdsPointers reports whether values of t can refer to other objects,
// so walking a slice of numbers costs nothing per element.
func holdsPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.String, reflect.Interface, reflect.Map:
		return true
	case reflect.Array:
		return t.Len() > 0 && holdsPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsPointers(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

// mapSize estimates a map's own memory with n entries of slot bytes each,
// for Go's swiss-table maps: a header, then groups of eight slots with a
// control word, the slots at most 7/8 full after growth by insertion.
func mapSize(n int, slot uintptr) int64 {
	const header, table, group = 48, 48, 8
	if n <= group {
		return allocSize(header) + allocSize(group+group*slot)
	}
	capacity := uintptr(group)
	for uintptr(n)*8 > capacity*7 {
		capacity *= 2
	}
	groups := capacity / group
	return allocSize(header) + allocSize(table) + allocSize(groups*(group+group*slot))
}

// sizeClasses are the Go allocator's small object sizes (runtime's
// sizeclasses.go); larger objects take whole 8 KiB pages.
var sizeClasses = []uintptr{
	8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280,
	1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528,
	6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432,
	19072, 20480, 21760, 24576, 27264, 28672, 32768,
}

// allocSize is the memory the allocator gives an object of n bytes.
func allocSize(n uintptr) int64 {
	if n == 0 {
		return 0
	}
	if n > sizeClasses[len(sizeClasses)-1] {
		const page = 8 << 10
		return int64((n + page - 1) / page * page)
	}
	i, _ := slices.BinarySearch(sizeClasses, n)
	return int64(sizeClasses[i])
}
