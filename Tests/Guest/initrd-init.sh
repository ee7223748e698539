#!/bin/sh
# /init of the guest's initramfs (busybox sh): loads what the Debian kernel
# needs to mount an ext4 root on virtio-blk, mounts it and hands over to
# systemd. Much faster under TCG than Debian's generic initrd (about 12 s).
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Dependencies first: Scripts/guest-test lists them in this order.
for m in $(cat /modules.order); do
    insmod "/modules/$m.ko" || echo "initrd: insmod $m failed" > /dev/console
done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
mkdir -p /root
mount -t ext4 -o rw /dev/vda /root || { echo "initrd: cannot mount /dev/vda" > /dev/console; poweroff -f; }
umount /proc /sys
mount --move /dev /root/dev 2>/dev/null || umount /dev
exec switch_root /root /sbin/init "$@"
