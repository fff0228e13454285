package sessions;

/** A set of longs by open addressing, with no boxing: the state writer's record of the users it has passed (by hash),
 * one add and one lookup per user of a partition. */
final class LongSet {
    private static final long FREE = 0L;  // the slot marker; 0 itself is held by `hasZero`
    private long[] slots = new long[1 << 10];
    private int size;
    private boolean hasZero;

    boolean contains(long value) {
        if (value == FREE) {
            return hasZero;
        }
        for (int at = slot(value, slots.length); ; at = (at + 1) & (slots.length - 1)) {
            long held = slots[at];
            if (held == value) {
                return true;
            }
            if (held == FREE) {
                return false;
            }
        }
    }

    /** Adds `value`; false when it was there already. */
    boolean add(long value) {
        if (value == FREE) {
            boolean added = !hasZero;
            hasZero = true;
            return added;
        }
        if ((size + 1) * 2 > slots.length) {
            grow();
        }
        for (int at = slot(value, slots.length); ; at = (at + 1) & (slots.length - 1)) {
            long held = slots[at];
            if (held == value) {
                return false;
            }
            if (held == FREE) {
                slots[at] = value;
                size++;
                return true;
            }
        }
    }

    private void grow() {
        long[] old = slots;
        slots = new long[old.length * 2];
        for (long value : old) {
            if (value != FREE) {
                int at = slot(value, slots.length);
                while (slots[at] != FREE) {
                    at = (at + 1) & (slots.length - 1);
                }
                slots[at] = value;
            }
        }
    }

    private static int slot(long value, int length) {
        long h = value * 0x9E3779B97F4A7C15L;  // the hashes are xxhash64 already; this spreads any other long
        return (int) (h >>> 40) & (length - 1);
    }

}
