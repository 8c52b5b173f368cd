# The dry run of scripts/device_checks.sh, sourced by it after it has unpacked the kit into a
# temporary folder and sourced the kit's env.sh (`device_checks.sh --dry-run`; ctest's
# devkit.dry_run). Runs on the build machine and needs no GPU; it tells, before any GPU time is
# spent, whether the kit will start on the GPU machine (docs/gpu.md, "Running the checks on a GPU
# machine"). It fails, naming each finding, when:
#   - a program or library of the kit needs a library that resolves neither inside the kit nor to
#     one the GPU machine has (the `lib` lines of scripts/device_image.txt): such a library is
#     found here only because the build machine has it;
#   - a command of any part (each goes through `bounded`, which here only notes it) is neither in
#     the kit nor on the GPU machine (the `cmd` lines); for env and mpirun, the program they
#     start is checked too;
#   - a program of the kit is run by no part;
#   - a Python script a part runs (tools/*.py: torch's baselines) is not in the tree;
#   - the default parts' budgets and FIXED_S (unpacking, env.sh, nvidia-smi, packing the results)
#     add up to more than CALL_LIMIT_S (one invocation), or, perf left out (it is measured once), to
#     more than DEFAULT_LIMIT_S (room for a rerun within the same 15 minutes of GPU time);
#   - scripts/device_perf.sh, where it exists, fails its own --dry-run (part_perf runs it).

# Each finding goes to stderr (the parts' own output is set aside here) and is counted.
dry_fail() { echo "FAIL: $*" | tee -a "$WORK/failures" >&2; }

# What device_image.txt says the GPU machine has, read once: "lib NAME" and "cmd NAME".
declare -A IMAGE_HAS=()
while read -r kind name _; do
  [ "$kind" = lib ] || [ "$kind" = cmd ] && IMAGE_HAS["$kind $name"]=1
done < "$IMAGE"
image_has() { [ -n "${IMAGE_HAS["$1 $2"]:-}" ]; }  # image_has lib|cmd NAME

check_program() {
  local path
  path=$(command -v "$1") || path=""
  case "$path" in "$KIT"/*) return 0 ;; esac
  image_has cmd "$(basename "$1")" && return 0
  dry_fail "part $PART runs '$1', which is neither in the kit nor on the GPU machine's list ($IMAGE)"
}

# bounded's stand-in: notes the command, checks its program and the one env or mpirun starts.
dry_check() {
  local words=("$@") i=0
  echo "$PART: $*" >> "$WORK/commands"
  if [ "${words[0]}" = env ]; then
    i=1
    while [[ "${words[i]:-}" == *=* || "${words[i]:-}" == -u ]]; do
      [ "${words[i]}" = -u ] && i=$((i + 1))  # env -u NAME: unset NAME
      i=$((i + 1))
    done
  fi
  check_program "${words[i]}"
  local word
  for word in "${words[@]}"; do
    case "$word" in
      # A script, or one named in an option (pytest's --ignore=FILE).
      *.py) [ -f "${word#--*=}" ] || dry_fail "$PART runs ${word#--*=}, which is not in the tree" ;;
    esac
  done
  [ "$(basename "${words[i]}")" = mpirun ] || return 0
  i=$((i + 1))
  while [ "$i" -lt "${#words[@]}" ]; do
    case "${words[i]}" in
      -n|-np|-x|--bind-to|--map-by) i=$((i + 2)) ;;
      -*) i=$((i + 1)) ;;
      *) break ;;
    esac
  done
  check_program "${words[i]:-mpirun-without-a-program}"
}

# Every ELF file of the kit: each library ldd resolves with the kit's env must be inside the kit
# or on the GPU machine's list; one not found here must be on that list.
check_libraries() {
  local file line name target magic files=0
  while read -r file; do
    LC_ALL=C read -r -n 4 magic < "$file" 2>/dev/null
    [ "${magic:-}" = $'\x7fELF' ] || continue
    files=$((files + 1))
    while read -r line; do
      name=${line%% *}
      case "$line" in
        *"=> not found"*)
          image_has lib "$name" ||
            dry_fail "${file#"$KIT"/} needs $name: not in the kit, not on the GPU machine's list" ;;
        *"=> /"*)
          target=${line#*=> }
          target=${target%% *}
          case "$target" in "$KIT"/*) ;; *)
            image_has lib "$name" ||
              dry_fail "${file#"$KIT"/} needs $name, found here at $target only: the kit lacks it" \
                       "and the GPU machine's list does not name it" ;;
          esac ;;
        /*|linux-vdso*)
          image_has lib "$(basename "$name")" ||
            dry_fail "${file#"$KIT"/} needs $name, not on the GPU machine's list" ;;
      esac
    done < <(ldd "$file" 2>/dev/null)
  done < <(find "$KIT" -type f)
  echo "$files"
}

dry_run_main() {
  local started part program files bound=$FIXED_S
  started=$(date +%s)
  : > "$WORK/failures"
  : > "$WORK/commands"
  files=$(check_libraries)
  for part in "${!BUDGET[@]}"; do
    PART=$part PART_DEADLINE=0
    "part_$part" > "$WORK/$part.log"
  done
  # The parts named on the command line (`--dry-run python`): what each would run there.
  for part in "${parts[@]}"; do
    echo "dry run: part $part runs:"
    grep "^$part: " "$WORK/commands" | sed "s/^$part: /  /"
  done
  for program in "$KIT"/bin/*; do
    program=$(basename "$program")
    grep -Eq "(^|[[:space:]])$program([[:space:]]|$)" "$WORK/commands" ||
      dry_fail "the kit carries $program, but no part runs it"
  done
  local rerun=$FIXED_S
  for part in "${DEFAULT_PARTS[@]}"; do
    bound=$((bound + BUDGET[$part]))
    [ "$part" = perf ] || rerun=$((rerun + BUDGET[$part]))
  done
  [ "$bound" -le "$CALL_LIMIT_S" ] ||
    dry_fail "a run of the default parts (${DEFAULT_PARTS[*]}) is bounded by $bound s, over" \
             "one invocation's bound, $CALL_LIMIT_S s"
  [ "$rerun" -le "$DEFAULT_LIMIT_S" ] ||
    dry_fail "a rerun of the default parts but perf is bounded by $rerun s, over" \
             "$DEFAULT_LIMIT_S s"
  echo "dry run: $files ELF files' libraries, $(wc -l < "$WORK/commands") commands of" \
       "${#BUDGET[@]} parts ($(ls "$KIT/bin" | wc -l) programs); default parts" \
       "(${DEFAULT_PARTS[*]}) and what runs around them bounded by $bound s (limit $CALL_LIMIT_S s)," \
       "a rerun without perf by $rerun s (limit $DEFAULT_LIMIT_S s);" \
       "$(($(date +%s) - started)) s"
  if [ -s "$WORK/failures" ]; then
    echo "dry run FAILED: $(wc -l < "$WORK/failures") findings (above)"
    return 1
  fi
  echo "dry run passed"
}
