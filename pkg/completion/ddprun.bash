# bash completion for ddprun: subcommands, and the flags of ddprun or of the
# subcommand being typed, read from its own --help (never out of date).
_ddprun() {
  local cur=${COMP_WORDS[COMP_CWORD]} sub=() i
  # The subcommand, when the first word after ddprun is one.
  case ${COMP_WORDS[1]-} in status|stacks|attach|doctor) ((COMP_CWORD > 1)) && sub=("${COMP_WORDS[1]}") ;; esac
  if ((COMP_CWORD == 1)) && [[ $cur != -* ]]; then
    COMPREPLY=($(compgen -W "status stacks attach doctor report" -- "$cur") $(compgen -f -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    # Stop at the program: its flags are its own (ddprun passes them on).
    if ((${#sub[@]} == 0)); then
      for ((i = 1; i < COMP_CWORD; i++)); do [[ ${COMP_WORDS[i]} == -* ]] || return 0; done
    fi
    local flags
    flags=$("${COMP_WORDS[0]}" "${sub[@]}" --help 2>/dev/null | grep -oE -- '--[a-z][a-z0-9_-]*' | sort -u)
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o filenames -F _ddprun ddprun
